"""A database provider on a MariaDB primary with an asynchronous replica: the read-only
replica refuses to grant (whoever the lock user is), a demoted primary makes a chain
degrade and queue its releases, and a promotion after a lag gives a second owner the
lock (the documented hazard) with a fence that still rises."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql  # type: ignore[import-untyped]  # no stubs in the dev extra
import pytest

from locks import BackendUnavailable, Breaker, FallbackChain, Lease
from locks.backends import DatabaseProvider, LocalProvider, database
from tests.servers.mariadb_replica import MariaDBNode, MariaDBPair

ADMIN, ADMIN_PASSWORD = "lockadmin", "lockadmin-test-pw"
ROW = "SELECT owner, token, fence, expires_at, acquired_at FROM locks.locks WHERE name = '{}'"


@pytest.fixture
def pair(mariadb_pair: MariaDBPair) -> MariaDBPair:
    """The pair, with the lock table made on the primary and replicated."""
    DatabaseProvider(mariadb_pair.primary.url).create_table()
    mariadb_pair.wait_caught_up()
    return mariadb_pair


@pytest.fixture
def providers() -> Iterator[list[DatabaseProvider]]:
    """Providers a test makes, closed after it, before the pair is restored."""
    made: list[DatabaseProvider] = []
    yield made
    for provider in made:
        provider.close()


def provider(made: list[DatabaseProvider], url: str, **options: Any) -> DatabaseProvider:
    made.append(DatabaseProvider(url, **options))
    return made[-1]


def admin_url(node: MariaDBNode) -> str:
    return f"mysql+pymysql://{ADMIN}:{ADMIN_PASSWORD}@{node.address}/locks?charset=utf8mb4"


def make_admin(pair: MariaDBPair) -> None:
    """A lock user with READ ONLY ADMIN (root has it too): read_only does not stop it.
    Made on the primary, replicated to the replica."""
    for host in ("127.0.0.1", "localhost"):
        pair.primary.query(
            f"CREATE USER IF NOT EXISTS '{ADMIN}'@'{host}' IDENTIFIED BY '{ADMIN_PASSWORD}'",
            f"GRANT READ_ONLY ADMIN ON *.* TO '{ADMIN}'@'{host}'",
            f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO '{ADMIN}'@'{host}'",
        )
    pair.wait_caught_up()


def row(node: MariaDBNode, key: str) -> dict[str, Any] | None:
    rows = node.query(ROW.format(key))
    return rows[0] if rows else None


def released(node: MariaDBNode, key: str) -> bool:
    """No row, or one kept free (expiry 0) for its fence."""
    found = row(node, key)
    return found is None or found["expires_at"] == 0


def in_other_thread(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call` made by another owner (owners are per thread)."""
    with ThreadPoolExecutor(max_workers=1) as other:
        return other.submit(call, *args, **kwargs).result()


def assert_read_only_refusal(error: BackendUnavailable, node: MariaDBNode, name: str) -> None:
    message = str(error)
    assert "read_only" in message
    assert f"database backend {name!r} at {node.address}" in message
    assert node.password not in message and ADMIN_PASSWORD not in message
    assert not error.ambiguous  # refused before it ran: nothing to release later


def test_the_replica_refuses_to_grant_naming_read_only_and_writes_nothing(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    before = pair.replica.value("SELECT COUNT(*) FROM locks.locks")
    on_replica = provider(providers, pair.replica.url)
    with pytest.raises(BackendUnavailable) as refused:
        on_replica.acquire(key, ttl=30, wait=0)
    assert_read_only_refusal(refused.value, pair.replica, "database")
    with pytest.raises(BackendUnavailable, match="read_only"):
        on_replica.ping()  # what a chain's probe and `locks status` see
    # a table missing on the replica is not created there either
    table = f"t_{uuid.uuid4().hex[:12]}"
    elsewhere = provider(providers, pair.replica.url, table=table)
    with pytest.raises(BackendUnavailable, match="read_only"):
        elsewhere.acquire(key, ttl=30, wait=0)
    assert pair.replica.value(f"SHOW TABLES FROM locks LIKE '{table}'") is None
    assert pair.replica.value("SELECT COUNT(*) FROM locks.locks") == before


def test_a_user_that_read_only_does_not_stop_is_refused_by_the_connection_check(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    make_admin(pair)
    # the premise: read_only lets this user write on the replica
    direct = pymysql.connect(
        host="127.0.0.1", port=pair.replica.port, user=ADMIN, password=ADMIN_PASSWORD,
        database="locks", ssl_disabled=True, autocommit=True,
    )  # fmt: skip
    pair.diverged = True  # the replica is written to: rebuilt after the test
    try:
        with direct.cursor() as cursor:
            cursor.execute(
                "INSERT INTO locks (name, owner, token, depth, fence, expires_at, acquired_at)"
                " VALUES (%s, 'someone', 't', 1, 1, 0, 0)",
                (key,),
            )
    finally:
        direct.close()
    assert row(pair.replica, key) is not None  # written through read_only, silently
    pair.replica.query(f"DELETE FROM locks.locks WHERE name = '{key}'")
    on_replica = provider(providers, admin_url(pair.replica))
    with pytest.raises(BackendUnavailable) as refused:
        on_replica.acquire(key, ttl=30, wait=0)
    assert_read_only_refusal(refused.value, pair.replica, "database")
    assert row(pair.replica, key) is None


def test_a_busy_privileged_connection_is_checked_again_within_the_ping_interval(
    pair: MariaDBPair,
    providers: list[DatabaseProvider],
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A primary demoted while the pool's connections are in use: they are checked again
    once `_IDLE_PING` has passed since their last check, busy or not."""
    make_admin(pair)
    monkeypatch.setattr(database, "_IDLE_PING", 0.3)
    admin = provider(providers, admin_url(pair.primary))
    held = admin.acquire(key, ttl=30)
    assert held is not None
    pair.primary.query("SET GLOBAL read_only = 1")
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # kept busy: never idle for the ping interval
        try:
            admin.is_held(held)
        except BackendUnavailable as error:
            assert_read_only_refusal(error, pair.primary, "database")
            break
        time.sleep(0.02)
    else:
        pytest.fail("the demoted primary still served the privileged user after 0.6 s")
    with pytest.raises(BackendUnavailable, match="read_only"):
        admin.acquire(key + ":2", ttl=30, wait=0)
    assert row(pair.primary, key + ":2") is None


def test_a_demoted_primary_refuses_grants_releases_and_renewals(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """The connections were made while it was writable: the server's own refusal
    (error 1290) is what the provider sees."""
    db = provider(providers, pair.primary.url)
    held = db.acquire(key, ttl=30)
    assert held is not None
    before = pair.primary.query("SELECT * FROM locks.locks ORDER BY name")
    pair.primary.query("SET GLOBAL read_only = 1")
    with pytest.raises(BackendUnavailable) as refused:
        db.acquire(key + ":new", ttl=30, wait=0)
    assert_read_only_refusal(refused.value, pair.primary, "database")
    assert "1290" in str(refused.value)
    with pytest.raises(BackendUnavailable, match="read_only"):
        db.extend(held, 30)
    with pytest.raises(BackendUnavailable, match="read_only"):
        db.release(held)
    assert pair.primary.query("SELECT * FROM locks.locks ORDER BY name") == before
    pair.primary.query("SET GLOBAL read_only = 0")
    db.release(held)  # a release that failed may be tried again
    assert released(pair.primary, key)


def test_a_chain_over_a_demoted_primary_degrades_and_queues_the_release(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    db = provider(providers, pair.primary.url, name="db")
    chain = FallbackChain([db, LocalProvider()], breaker=Breaker(reset_timeout=0.2))
    held = chain.acquire(key, ttl=30)
    assert held is not None and held.backend == "db"
    pair.primary.query("SET GLOBAL read_only = 1")
    other = chain.acquire(key + ":2", ttl=30, wait=0)
    assert other is not None and other.backend == "local"
    assert chain.counts["degraded"] == 1
    assert chain.counts["ambiguous"] == 0  # a refusal took nothing: no token to release
    chain.release(other)
    chain.release(held)  # no error: queued for when the tier answers
    assert chain.pending("db") == 1 and chain.counts["release_queued"] == 1
    assert row(pair.primary, key) is not None  # still there: the release waits
    pair.primary.query("SET GLOBAL read_only = 0")
    time.sleep(0.25)  # the breaker lets a probe through
    again = chain.acquire(key + ":3", ttl=30, wait=0)
    assert again is not None and again.backend == "db"
    chain.release(again)
    deadline = time.monotonic() + 5
    while chain.pending("db") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert chain.pending("db") == 0 and released(pair.primary, key)


def test_a_replica_copies_lock_rows_as_they_are(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """MariaDB's default MIXED binlog: the upsert travels as a row image, the plain insert
    as a statement replayed with the primary's timestamp. Either way the replica holds
    the primary's fences, which a promotion then counts on."""
    db = provider(providers, pair.primary.url)
    first = db.acquire(key, ttl=0.05)
    assert first is not None
    time.sleep(0.1)
    second = in_other_thread(db.acquire, key, ttl=30)  # a take-over: the upsert
    assert second is not None and second.fence > first.fence
    pair.wait_caught_up()
    assert row(pair.replica, key) == row(pair.primary, key)
    assert row(pair.primary, key)["fence"] == second.fence  # type: ignore[index]


def test_the_primary_grants_while_its_replica_is_paused_or_dead_and_it_catches_up(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """Asynchronous replication: a commit never waits for the replica."""
    db = provider(providers, pair.primary.url)
    pair.replica.pause()
    paused = db.acquire(key + ":paused", ttl=30, wait=0)
    pair.replica.kill()
    dead = db.acquire(key + ":dead", ttl=30, wait=0)
    assert paused is not None and dead is not None
    pair.replica.start()  # it resumes replicating from where it was
    pair.wait_replicating()
    pair.wait_caught_up()
    assert row(pair.replica, key + ":paused") == row(pair.primary, key + ":paused")
    assert row(pair.replica, key + ":dead") == row(pair.primary, key + ":dead")


def test_after_a_lagging_promotion_a_second_owner_gets_the_lock_with_a_higher_fence(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """The hazard the runbook measures: the row written after the replica's last fetch is
    not on the promoted replica, so another owner is granted the lock at once. Its fence
    comes from the promoted server's clock, above the first grant's."""
    old = provider(providers, pair.primary.url)
    pair.stop_replication()  # the lag, made as long as the test needs
    first = old.acquire(key, ttl=30)
    assert first is not None
    pair.promote()
    assert row(pair.replica, key) is None
    pair.primary.query("SET GLOBAL read_only = 1")  # the runbook fences the old primary
    new = provider(providers, pair.replica.url)  # the url flipped to the promoted server
    second: Lease | None = in_other_thread(new.acquire, key, ttl=30, wait=0)
    assert second is not None, "the promoted replica had the row after all"
    assert second.owner != first.owner and second.fence > first.fence
    # the first holder learns it at its next renewal: the old primary refuses it
    with pytest.raises(BackendUnavailable, match="read_only"):
        old.extend(first, 30)
    new.release(second)


def test_with_semi_sync_an_acknowledged_row_survives_a_crash_and_promotion(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """The answer to the hazard, as Redis's WAIT is on Redis: with semi-synchronous
    replication (AFTER_SYNC) an acquire returns once the replica has the row in its
    relay log, and a promotion that applies the relay log first keeps it."""
    pair.semi_sync()
    old = provider(providers, pair.primary.url)
    first = old.acquire(key, ttl=30)
    assert first is not None
    pair.primary.kill()  # at once: nothing more is sent
    pair.promote()
    new = provider(providers, pair.replica.url)
    assert in_other_thread(new.acquire, key, ttl=30, wait=0) is None  # still held
    assert row(pair.replica, key)["fence"] == first.fence  # type: ignore[index]


def test_a_promoted_replica_holding_an_older_version_of_the_row_counts_on_from_it(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """The replica has the first grant's row; the primary took it over after the replica
    stopped fetching. The next grant takes over the older row: max(fence + 1, clock) is
    above the take-over's fence it never saw."""
    old = provider(providers, pair.primary.url)
    first = old.acquire(key, ttl=0.2)
    assert first is not None
    pair.wait_caught_up()
    pair.stop_replication()
    time.sleep(0.25)  # the first grant expires
    second = in_other_thread(old.acquire, key, ttl=0.2)
    assert second is not None and second.fence > first.fence
    pair.promote()
    assert row(pair.replica, key)["fence"] == first.fence  # type: ignore[index]
    new = provider(providers, pair.replica.url)  # the older row has expired there too
    third = in_other_thread(new.acquire, key, ttl=30, wait=0)
    assert third is not None and third.fence > second.fence > first.fence
    new.release(third)


def test_a_promoted_server_whose_clock_is_behind_repeats_fences_until_it_catches_up(
    pair: MariaDBPair, providers: list[DatabaseProvider], key: str
) -> None:
    """The fence's limit: a row missing on the promoted server is seeded from its clock.
    The old primary's clock runs 1.5 s ahead here (a session timestamp set at connect):
    a grant there, then one on the promoted server at once, goes backwards; one made
    more than the skew later does not. The runbook's wait before the flip is that gap."""
    skew = 1.5
    skewed = provider(
        providers,
        pair.primary.url,
        connect_args={"init_command": f"SET timestamp = UNIX_TIMESTAMP(NOW(6)) + {skew}"},
    )
    pair.stop_replication()
    first = skewed.acquire(key, ttl=0.1)
    assert first is not None
    pair.promote()
    new = provider(providers, pair.replica.url)
    at_once = in_other_thread(new.acquire, key, ttl=0.1, wait=0)
    assert at_once is not None and at_once.fence < first.fence  # the hazard, shown
    new.release(at_once)
    # both servers read this host's clock: wait until it has passed the skewed fence
    time.sleep(max(0.0, first.fence / 1e6 + 0.05 - time.time()))
    later = in_other_thread(new.acquire, key, ttl=30, wait=0)
    assert later is not None and later.fence > first.fence
    new.release(later)
