"""`benchmarks.profile --null-driver`: our own code's time, with the driver and the
server taken out. Checked for what it claims (no statement reaches the server, and the
pool is whole again after), never for speed."""

from __future__ import annotations

from benchmarks.profile import our_own_time
from locks.backends import DatabaseProvider
from tests.servers import MariaDBServer


def test_the_null_driver_sends_nothing_and_gives_the_pool_back(
    mariadb_server: MariaDBServer, key: str
) -> None:
    provider = DatabaseProvider(mariadb_server.url)

    def questions() -> int:  # statements the server was asked, its own status reads too
        return int(mariadb_server.sql("SHOW GLOBAL STATUS LIKE 'Questions'").split()[-1])

    try:
        lease = provider.acquire(key, ttl=5)  # the table made, a connection pooled
        assert lease is not None
        provider.release(lease)
        first = questions()
        before = questions()
        reading = before - first  # what one status read counts itself (its client's too)
        seconds = our_own_time(provider, 300)
        assert questions() - before == reading
        assert seconds > 0
        lease = provider.acquire(key, ttl=5)  # the real driver again
        assert lease is not None and provider.is_held(lease)
        provider.release(lease)
    finally:
        provider.close()
