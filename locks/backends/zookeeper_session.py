"""What both faces of the ZooKeeper backend share (the threaded provider in
`locks.backends.zookeeper`, the asyncio one in `locks.aio.zookeeper`): the arguments
and the kazoo client they make (TLS, digest or SASL, ACLs), the session's state and
what its loss or suspension does to the leases, node names and the queue's order, how
kazoo's errors sort, the redacting log filter, and the algorithm itself.

The algorithm is written once, as steps (`Steps`, as `locks.steps` does for a chain): a
generator sends its requests with kazoo's `*_async` calls, which only queue them, and
yields each `IAsyncResult` it needs, a `Pause` (a watch's signal, or a time-out), or
a `Blocking` call; it is sent the reply, or thrown the error. The threaded face waits
for each on the calling thread; the asyncio face awaits it, and closes the generator
when its task is cancelled (`GeneratorExit` at the yield: what was sent must still be
undone). Each face also says how work leaves kazoo's threads (`_hand_off`, `_later`,
`_run_in_background`), how a signal is made, and how a granted node's watch is set."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionClosedRequireSaslError,
    SessionExpiredError,
    SessionMovedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import SASL, Create2
from kazoo.protocol.states import EventType, KazooState
from kazoo.retry import KazooRetry
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_acl, make_digest_acl

from locks.errors import AccessDenied, BackendError, BackendUnavailable, ConfigError, LockError
from locks.forking import start_afresh_when_forked
from locks.holds import Hold
from locks.keeper import Grant, LeaseKeeper
from locks.names import check_seconds, check_zookeeper_path, zookeeper_node_name
from locks.provider import Capabilities, Holder, Lease
from locks.tls import HandshakeProbe, TLSSettings, tls_settings

R = TypeVar("R")

# A generator of requests (see the module docstring): it yields an `IAsyncResult`, a
# `Pause` or a `Blocking`, and returns R
Steps = Generator[Any, Any, R]


class Signal(Protocol):
    """What the steps need of an event set from kazoo's threads (each face's own:
    `threading.Event`, or one a task can await)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Pause:
    """A step: wait until `signal` is set or `seconds` have passed."""

    signal: Signal
    seconds: float


@dataclass(frozen=True, slots=True)
class Blocking:
    """A step: a call that blocks (a handshake of our own), made off the event loop."""

    call: Callable[[], Any]


class _Redacting(logging.Filter):
    """kazoo logs every request at DEBUG, a digest `Auth` with its password among them:
    our clients log through `_KAZOO_LOG`, whose records have every live provider's
    secrets masked."""

    def __init__(self) -> None:
        super().__init__()
        self.providers: weakref.WeakSet[ZooKeeperSession] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = [secret for provider in list(self.providers) for secret in provider._secrets()]
        if secrets:
            message = masked = record.getMessage()
            for secret in secrets:
                masked = masked.replace(secret, "***")
            if masked != message:
                record.msg, record.args = masked, ()
        return True


_REDACTING = _Redacting()
# a child of kazoo's own logger: whatever logging kazoo is given applies
_KAZOO_LOG = logging.getLogger("kazoo.client.locks")
_KAZOO_LOG.addFilter(_REDACTING)

UNAVAILABLE = (
    ConnectionLoss,
    SessionExpiredError,
    SessionMovedError,
    ConnectionClosedError,
    OperationTimeoutError,
    KazooTimeoutError,
)
_SEQUENCE_DIGITS = 10  # ZooKeeper appends a 10-digit counter to sequential nodes
_RECHECK = 1.0  # a waiter re-reads the queue at least this often, whatever its watch does
# a grant still held this long gets a watch on its node (`_watch_node_later`); most are
# gone sooner, and a watch costs its release a notification and a thread hand-off
WATCH_AFTER = 0.05
_AUTH_SCHEMES = ("digest", "sasl")
# SASL exchanges the server cut in a row before that is taken for a refusal (one going
# down mid-exchange is retried; some servers close the connection to refuse)
_SASL_DROPS = 3
# round trips of one SASL exchange before it is taken for a refusal: DIGEST-MD5 takes
# two, and a server without SASL answers every message with an empty challenge, which
# kazoo answers at once, until the session expires
_SASL_ROUNDS = 8


class _CreateContainer(Create2):  # type: ignore[misc]
    """ZooKeeper's createContainer (opcode 19), which kazoo does not offer: the server
    deletes a container node some time after its last child is gone, so lock parents
    do not pile up however many names are used."""

    type = 19


class ZooKeeperSession(LeaseKeeper):
    """Both faces' provider of type `zookeeper` (kazoo), but for how they wait: fair,
    reentrant per owner, fenced by the node's czxid, the session for a lease."""

    type_name = "zookeeper"
    unavailable_errors = UNAVAILABLE
    # a server enforcing SASL answers a client without it SessionClosedRequireSasl
    denied_errors = (NoAuthError, AuthFailedError, SessionClosedRequireSaslError)
    driver_errors = (KazooException,)

    capabilities = Capabilities(
        reentrant=True,
        expires=False,
        renewable=False,
        fair=True,
        fenced=True,
        cross_process=True,
        cross_host=True,
    )

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        *,
        client: KazooClient | None = None,
        name: str = "zookeeper",
        root: str = "/locks",
        session_timeout: float = 10.0,
        connect_timeout: float = 1.0,
        request_timeout: float = 1.0,
        watchdog_ttl: float = 30.0,
        username: str | None = None,
        password: str | None = None,
        auth: str = "digest",
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_key_password: str | None = None,
        tls_check_hostname: bool = True,
    ) -> None:
        """`username` and `password`: authenticate as that identity and give every node
        this provider creates an ACL that admits only it (lock parents: create, delete,
        read; lock nodes: read), so no other client of the ensemble can delete a
        holder's node or queue in front of it. Without them, nodes are open to every
        client (ZooKeeper's `world:anyone`). With a `client` passed in, its own
        `auth_data` (or `sasl_options`) must hold the same identity.

        `auth`: how to authenticate, `"digest"` (ZooKeeper's own scheme: the server
        cannot refuse it, a wrong password shows when a node's ACL does) or `"sasl"`
        (DIGEST-MD5 against the server's JAAS users, needs the `zookeeper-sasl` extra:
        the server checks the password at every connection, and with
        `enforce.auth.schemes=sasl` refuses clients without one). A refused SASL
        password is `AccessDenied`, and kazoo stops reconnecting after it.

        `tls_ca` (a PEM file of CAs), `tls_cert` and `tls_key` (a client certificate and
        its key, both or neither; `tls_key_password` if the key is encrypted): connect
        over TLS (to the servers' `secureClientPort`), verifying the chain and, unless
        `tls_check_hostname` is False, that the certificate names the host as written
        in `hosts`. A certificate that does not verify, or a server that refuses ours,
        is `AccessDenied`."""
        super().__init__(name, watchdog_ttl)
        if auth not in _AUTH_SCHEMES:
            raise ValueError(f"auth must be 'digest' or 'sasl', got {auth!r}")
        self.auth = auth
        self._tls = _tls_options(tls_ca, tls_cert, tls_key, tls_key_password,
                                 tls_check_hostname)  # fmt: skip
        if client is not None and self._tls:
            raise ValueError("tls_*: configure TLS on the KazooClient passed in, not here")
        if (username is None) != (password is None):
            raise ValueError("username and password: give both, or neither")
        if auth == "sasl" and username is None:
            raise ValueError("username and password: auth 'sasl' needs both")
        if username is not None and (not isinstance(username, str) or not username
                                     or ":" in username):  # fmt: skip
            raise ValueError(f"username must be a non-empty str without ':', got {username!r}")
        if password is not None and not isinstance(password, str):
            raise ValueError("password must be a str")
        # kazoo's SASL needs pure-sasl, and finds out only once connected
        if auth == "sasl" and client is None and importlib.util.find_spec("puresasl") is None:
            raise ConfigError(
                "auth 'sasl' needs the 'zookeeper-sasl' extra, whose module 'puresasl' is "
                "not installed: pip install 'fallback-locks[zookeeper-sasl]'"
            )
        self.username = username
        self._password = password
        self._key_password = tls_key_password
        if password or tls_key_password:
            _REDACTING.providers.add(self)
        self._parent_acl, self._node_acl = _acls(auth, username, password)
        self.root = check_zookeeper_path(root, "root")
        self.connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        self.request_timeout = check_seconds(request_timeout, "request_timeout")
        self._session_timeout = check_seconds(session_timeout, "session_timeout")
        self._owns_client = client is None
        # a client passed in keeps its session when this provider closes: delete the nodes
        self.release_on_close = not self._owns_client
        if client is None:
            if not isinstance(hosts, str):
                raise TypeError(f"hosts must be a str such as 'h1:2181,h2:2181', not {hosts!r}")
            client = self._new_client(hosts)
        elif not isinstance(client, KazooClient):
            raise TypeError(f"client must be a KazooClient, not {type(client).__name__}")
        self.client = client
        self.address = ",".join(f"{host}:{port}" for host, port in client.hosts)
        self.address += client.chroot or ""
        self._reset()
        self._hear_sasl(client)
        client.add_listener(self._on_state)
        start_afresh_when_forked(self)  # `after_fork_in_child`: each face's

    # -- what each face supplies ----------------------------------------------------

    @abstractmethod
    def _new_signal(self) -> Signal:
        """An event set from any thread, which this face's `Pause` waits on."""

    def _hand_off(self, call: Callable[..., object], *args: Any) -> None:
        """Run `call(*args)` soon, elsewhere than the caller: kazoo's threads must never
        wait on our I/O, nor run a holder's `on_lost`. Here, on a thread of its own."""
        threading.Thread(target=call, args=args, daemon=True).start()

    def _later(self, seconds: float, call: Callable[..., object], *args: Any) -> None:
        """`_hand_off`, `seconds` from now."""
        timer = threading.Timer(seconds, call, args=args)
        timer.daemon = True
        timer.start()

    @abstractmethod
    def _run_in_background(self, steps: Steps[object]) -> None:
        """Drive `steps` to their end on their own (a thread, or a task)."""

    @abstractmethod
    def after_fork_in_child(self) -> None:
        """`_start_afresh`, and whatever else the face keeps for kazoo's threads."""

    @abstractmethod
    def _watch_node_later(self, node: str, token: str) -> None:
        """Have `_watch_own(node, token)` called `WATCH_AFTER` from now unless the grant
        is released first, its handle kept in `_node_watches[token]`."""

    @abstractmethod
    def _unwatch_node(self, watch: Any) -> None:
        """Cancel a handle `_watch_node_later` kept, if it is still due."""

    # -- set-up ---------------------------------------------------------------------------

    def _new_client(self, hosts: str) -> KazooClient:
        # Keep reconnecting in the background (callers fail fast meanwhile), a round of
        # the hosts at least every tenth of the session timeout: a session moved after an
        # election must be back before it expires. Let grow to a second between rounds,
        # the backoff lost half the leases of 1 s sessions in the leader elections
        # measured, though the ensemble served again within 0.5 s.
        pause = min(1.0, self._session_timeout / 10)
        sasl = self.auth == "sasl"
        digest = not sasl and self.username is not None
        try:
            client = KazooClient(
                hosts=hosts,
                logger=_KAZOO_LOG,
                timeout=self._session_timeout,
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=pause),
                auth_data=[("digest", f"{self.username}:{self._password}")] if digest else None,
                sasl_options={"mechanism": "DIGEST-MD5", "username": self.username,
                              "password": self._password} if sasl else None,
                **self._tls,
            )  # fmt: skip
        except (ValueError, KazooException) as exc:
            raise ValueError(f"hosts {hosts!r} is not a ZooKeeper connect string: {exc}") from exc
        return client

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._started: Any = None  # what kazoo's start_async returned, once called
        self._started_at = 0.0
        self._connected_once = False
        self._up = self._new_signal()  # set once the session is first CONNECTED
        self._nodes: dict[str, str] = {}  # token of a grant -> its node's path
        # token of a grant -> its node's watch, due or set (the face's handle)
        self._node_watches: dict[str, Any] = {}
        # token of a grant not yet handed out -> the session its node was created in
        self._born_in: dict[str, int | None] = {}
        # the listener's view of the session, and the lock that orders it with new grants
        self._state_lock = threading.Lock()
        self._in_doubt = False
        self._connections = 0  # times the session was connected (again)
        self._cleaning = False  # a background cleaner is running (one at most)
        # creates whose outcome is unknown and deletes that failed: (parent, token) pairs
        # whose nodes must go once ZooKeeper answers again, or they would hold the lock
        # for as long as this session lives
        self._leftovers: set[tuple[str, str]] = set()
        self._suspended_since: float | None = None
        self._forked_client = False
        # the last handshake of our own while kazoo could not connect over TLS: when,
        # and what refused us (None: nothing did)
        self._tls_probe = HandshakeProbe(self.client.hosts, self.connect_timeout)
        # SASL (`_hear_sasl`): the error the server refused us with (kazoo has stopped),
        # set once the first exchange has ended either way, drops mid-exchange in a row
        self._refused: BaseException | None = None
        self._sasl_settled = self._new_signal()
        self._sasl_drops = 0

    def _hear_sasl(self, client: KazooClient) -> None:
        """Learn how each SASL exchange of `client` ends, if it uses SASL (ours, or one
        passed in). kazoo says CONNECTED before it authenticates, and a refusal
        (`SessionClosedRequireSaslError` when the server enforces SASL) kills its
        connection thread: callers see only a lost session, which would pass for an
        outage. The refusal is kept (`_refused`: `AccessDenied` from then on) and handed
        to kazoo as the `AuthFailedError` it stops on cleanly. A connection cut
        mid-exchange is retried like any drop, unless it keeps happening; an exchange
        that goes on and on is a server without SASL."""
        connection = client._connection
        if connection.sasl_options is None:
            return
        authenticate, submit = connection._authenticate_with_sasl, connection._submit

        def submit_or_give_up(request: Any, timeout: float, xid: int | None = None) -> None:
            if isinstance(request, SASL) and (xid or 0) > _SASL_ROUNDS:
                raise AuthFailedError(f"no SASL exchange after {_SASL_ROUNDS} round trips: "
                                      "does the server have a SASL authProvider?")  # fmt: skip
            submit(request, timeout, xid)

        def authenticate_and_tell(host: str, timeout: float) -> None:
            try:
                authenticate(host, timeout)
            except (ConnectionDropped, KazooTimeoutError):
                raise  # an outage: kazoo reconnects
            except AuthFailedError as error:
                if isinstance(error.__cause__, ConnectionDropped):  # kazoo's "dropped in SASL"
                    self._sasl_drops += 1
                    if self._sasl_drops < _SASL_DROPS:
                        raise ConnectionDropped("connection cut during SASL") from error
                self._refuse(error)
                raise
            except Exception as error:  # the server's error code, pure-sasl's errors
                self._refuse(error)
                raise AuthFailedError(f"SASL refused: {type(error).__name__}") from error
            self._sasl_drops = 0
            self._sasl_settled.set()

        connection._authenticate_with_sasl = authenticate_and_tell
        connection._submit = submit_or_give_up

    def _refuse(self, error: BaseException) -> None:
        self._refused = error
        self._sasl_settled.set()

    def _start_afresh(self) -> None:
        """In a forked child: kazoo's threads are gone there and its socket is the
        parent's session, so the child gets a session of its own (the parent's holds are
        the parent's)."""
        self._reset()
        if self._owns_client:
            hosts = self.address
            self.client = self._new_client(hosts)
            self._hear_sasl(self.client)
            self.client.add_listener(self._on_state)
        else:
            self._forked_client = True

    def _domain(self) -> Hashable:
        return ("zookeeper", self.address, self.root)

    def _secrets(self) -> list[str]:
        return [secret for secret in (self._password, self._key_password) if secret]

    def _stop_client(self) -> None:
        """Stop the client we made, which ends its session (blocks until kazoo's threads
        are done)."""
        if self._owns_client and self._started is not None:
            self.client.stop()
            self.client.close()

    # -- connection and errors ----------------------------------------------------------

    def _connect_steps(self) -> Steps[None]:
        """Fail at once unless connected (kazoo reconnects in the background); only the
        first call, which starts the client, waits up to `connect_timeout`."""
        if self._forked_client:
            raise BackendError(
                f"{self._where()}: a KazooClient passed in does not survive fork(); "
                "give the child a client of its own", backend=self.name, address=self.address,
            )  # fmt: skip
        if self._started is None:
            with self._lock:
                if self._started is None:
                    self._started_at = time.monotonic()
                    self._started = self.client.start_async()
                    if self._started.is_set():  # a client passed in, connected already
                        self._up.set()
        # while the first connection is being made, callers wait for it (up to
        # connect_timeout from its start); after that they fail fast. With SASL, for its
        # first exchange to end too: kazoo is CONNECTED before it authenticates
        sasl = self._sasl_settled if self._owns_client and self.auth == "sasl" else None
        if not self._connected_once or (sasl is not None and not sasl.is_set()):
            left = self._started_at + self.connect_timeout - time.monotonic()
            awaited = self._up if sasl is None else sasl
            if left > 0 and not awaited.is_set():
                yield Pause(awaited, left)
        self._check_refused()
        if self.client.state != KazooState.CONNECTED:
            if self.client.use_ssl:
                refusal = yield Blocking(self._tls_refusal)
                if refusal is not None:
                    raise self._refused_tls(*refusal)
            raise self._unavailable(ConnectionLoss(f"session is {self.client.state}"))

    def _check_refused(self) -> None:
        """Raise `AccessDenied` if the server refused our SASL authentication."""
        refused = self._refused
        if refused is not None:
            raise AccessDenied(
                f"{self._where()} refused SASL authentication as {self.username!r}: "
                f"{self._detail(refused)} (check username and password)",
                backend=self.name, address=self.address,
            ) from refused  # fmt: skip

    def _classify(self, error: BaseException) -> type[BackendUnavailable] | type[BackendError]:
        """Once the server has refused our SASL authentication, kazoo has stopped: a call
        fails with a lost or closed connection, which is that refusal, not an outage."""
        if self._refused is not None:
            return AccessDenied
        return super()._classify(error)

    def _tls_refusal(self) -> Any:
        """What refused our TLS, if something did (blocks: a handshake). kazoo retries a
        handshake that failed as if the server were down, and its caller sees a
        connection time-out either way: one handshake of our own, with the client's
        settings, to the first host that takes a connection tells a certificate that
        does not verify, or a server refusing ours, from an outage
        (`locks.tls.HandshakeProbe`: at most once a second, within `connect_timeout`).
        Only while not connected."""
        client = self.client
        if not client.verify_certs:  # a client passed in that verifies nothing
            return None
        settings = TLSSettings(client.ca, client.certfile, client.keyfile,
                               client.keyfile_password or None,
                               bool(getattr(client, "check_hostname", False)))  # fmt: skip
        try:
            context = settings.context()
        except OSError as error:  # a client passed in whose files do not load
            raise BackendError(
                f"{self._where()}: cannot load its TLS files: {self._detail(error)}",
                backend=self.name, address=self.address,
            ) from error  # fmt: skip
        return self._tls_probe.refusal(context)

    # -- the session's state ------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # runs on kazoo's connection thread: flag, and hand any I/O to the face
        # under the lock: a grant being handed out (`_hand_out`) or a node left behind
        # (`_leave`) either sees the new state or is seen here
        with self._state_lock:
            held = self._holds()
            self._in_doubt = state != KazooState.CONNECTED
            if state in (KazooState.SUSPENDED, KazooState.CONNECTED):
                for hold in held:
                    for level in hold.levels:
                        level.state.suspended = self._in_doubt
            if state == KazooState.CONNECTED:
                self._connections += 1
            clean = self._start_cleaner()
        if state == KazooState.CONNECTED:
            if self._connected_once:  # back: kazoo dropped every watch when it was lost
                self._hand_off(self._watch_again)
            self._connected_once = True
            self._up.set()
        if state == KazooState.SUSPENDED:
            since = self._suspended_since = time.monotonic()
            # the timeout asked for: kazoo does not keep the one the server granted (a
            # server's maxSessionTimeout below it would expire the session sooner)
            self._later(self.client._session_timeout / 1000, self._suspended_too_long, since)
        else:
            self._suspended_since = None
        if clean:
            self._run_in_background(self._cleaning_steps())
        elif state == KazooState.LOST and held:
            self._hand_off(self._lose_all, held, "the ZooKeeper session expired")

    def _watch_again(self) -> None:
        """After a connection loss, each held node's watch is set again (kazoo has no
        SetWatches: it fires every watch with a NONE event when the connection goes, and
        forgets them); a node deleted meanwhile is heard of in the reply."""
        for token, node in list(self._nodes.items()):
            with contextlib.suppress(KazooException):  # lost again: the listener hears it
                self._watch_own(node, token)

    def _suspended_too_long(self, since: float) -> None:
        """Still no answer a whole session timeout after the connection was lost: the
        server has expired the session, or will before anyone learns otherwise."""
        if self._suspended_since != since:
            return  # reconnected (or lost) meanwhile
        held = self._holds()
        for hold in held:  # if the session survives after all, these nodes must still go
            node = self._nodes.get(hold.anchor.token)
            if node is not None:
                self._leave(node.rsplit("/", 1)[0], hold.anchor.token)
        self._lose_all(held, "no answer from ZooKeeper for the whole session timeout")

    def _lose_all(self, held: list[Hold], reason: str) -> None:
        for hold in held:
            self._lose(hold, reason)
            self._drop_node(hold.anchor.token)

    def _check_hold(self, hold: Hold) -> None:
        if self.client.state != KazooState.CONNECTED or hold.anchor.state.suspended:
            raise self._unavailable(ConnectionLoss(f"session is {self.client.state}"))

    def _hand_out(self, lease: Lease) -> None:
        """Give a lease being handed out the session's state now. Its last reply may have
        come just before the connection dropped, and the state listener flags only the
        holds it can see: a grant it missed would pass `check()` while in doubt, or
        outlive the session its node died with."""
        hold = lease.state.hold
        assert isinstance(hold, Hold)
        with self._state_lock:
            born_in = self._born_in.pop(hold.anchor.token, None)  # first levels only
            expired = born_in is not None and born_in != self._session()
            if not expired:
                lease.state.suspended = self._in_doubt
                return
        node = self._drop_node(hold.anchor.token)
        if node is not None:  # gone with its session; if not, it must not outlive this
            self._leave(node.rsplit("/", 1)[0], hold.anchor.token)
        lease.state.mark_lost("the ZooKeeper session expired before it was handed out")
        self._forget(hold)
        raise self._unavailable(SessionExpiredError("the session expired"), key=lease.key)

    def _session(self) -> int | None:
        """The session's id, kept while SUSPENDED (`client_id` is None then), None
        between sessions."""
        session_id: int | None = self.client._session_id
        return session_id

    # -- the algorithm ------------------------------------------------------------------

    def _parent(self, key: str) -> str:
        return _parent_of(self.root, key)

    def _acquire_steps(
        self, key: str, owner: str, token: str, deadline: float | None
    ) -> Steps[Grant | None]:
        yield from self._connect_steps()
        parent = self._parent(key)
        if self._leftovers:  # a node of a lost reply would make this owner wait on itself
            yield from self._clean_steps()
            if any(left == parent for left, _ in self._leftovers):  # still there, maybe
                raise self._unavailable(ConnectionLoss("a node of ours is left to delete"))
        sent_at = time.monotonic()
        session = self._session()
        node, fence, children = yield from self._create_steps(parent, key, owner, token)
        try:
            granted = yield from self._turn_steps(parent, node, deadline, children)
        except GeneratorExit:  # its caller is gone (a cancelled task): the node goes all the same
            self._leave(parent, token)
            raise
        except BaseException:
            # keep the original error; a failed delete is remembered as a leftover
            with contextlib.suppress(BackendUnavailable):
                yield from self._delete_steps(parent, node, token)
            raise
        if not granted:
            yield from self._delete_steps(parent, node, token)
            return None
        self._nodes[token] = node
        self._born_in[token] = session
        self._watch_node_later(node, token)
        return Grant(token, fence, 1, sent_at)

    def _watch_own(self, node: str, token: str) -> None:
        """Hear at once of our node deleted by someone else (an operator breaking the
        lock): there is no renewal that would find out. Sent without waiting for the
        reply: ZooKeeper answers a session in order, so the watch is set before any
        later request of ours, and a node already gone is seen in the reply. Set
        `WATCH_AFTER` into the grant (`_watch_node_later`): a break before that is
        heard then."""

        def gone(event: Any = None) -> None:  # on kazoo's event thread: hand off
            if token in self._nodes and (event is None or event.type == EventType.DELETED):
                self._hand_off(self._broken, token)

        def answered(result: Any) -> None:
            if result.successful() and result.value is None:
                gone()

        self.client.exists_async(node, watch=gone).rawlink(answered)

    def _broken(self, token: str) -> None:
        """Our node went while we held it, and not by our own release."""
        if self._drop_node(token) is None:
            return  # released meanwhile
        self._born_in.pop(token, None)
        for hold in self._holds():
            if hold.anchor.token == token:
                self._lose(hold, "its node was deleted: someone broke the lock")

    def _create_steps(
        self, parent: str, key: str, owner: str, token: str
    ) -> Steps[tuple[str, int, list[str]]]:
        """Our ephemeral-sequential child, named after the token so that a create whose
        reply was lost can still be found, with the owner as its data (for `holder`).
        The children are listed in the same round trip: ZooKeeper answers one session's
        requests in order, so the list sent right behind the create already holds our
        node. Returns path, czxid (the fence) and the children."""
        for _ in range(3):
            with self._translated(ambiguous=True, key=key, token=token):
                created = self._create_node(parent, token, owner)
                listed = self.client.get_children_async(parent)
                # The later reply first: once it is in, so is the create's, and this
                # thread is woken once for the two, not twice (~5 % of a cycle).
                unlisted: Exception | None = None
                children: list[str] = []
                try:
                    children = yield listed
                except Exception as error:  # what it means depends on the create's reply
                    unlisted = error
                except BaseException:  # its caller is gone: the create runs on all the same
                    self._create_abandoned(created, parent, token)
                    raise
                try:
                    if unlisted is not None and not created.ready():
                        raise unlisted  # no reply in time: not one more timeout for it
                    chrooted, stat = yield created
                    path = self.client.unchroot(chrooted)
                except NoNodeError:
                    yield from self._parent_steps(parent)
                    continue
                except UNAVAILABLE:  # it may have run, or may yet (a reply not come in time)
                    self._create_abandoned(created, parent, token)
                    raise
                except GeneratorExit:  # its caller is gone: the create runs on all the same
                    self._create_abandoned(created, parent, token)
                    raise
                if unlisted is not None:
                    # it did run (a member died between the two replies): unknown to the
                    # caller, our node would hold the lock for as long as the session lives
                    self._leave(parent, token)
                    raise unlisted
            return path, int(stat.czxid), children
        raise self._unavailable(NoNodeError(f"{parent} keeps disappearing"), key=key)

    def _create_node(self, parent: str, token: str, owner: str) -> Any:
        """kazoo's `create_async(..., ephemeral=True, sequence=True, include_data=True)`
        as its one request: its reply is the node's path under the chroot, and its stat.
        kazoo's own wraps each create in closures that refer to each other, a cycle of
        ~50 objects a lock only the garbage collector frees."""
        request = Create2(_prefix_root(self.client.chroot, f"{parent}/{token}-", trailing=True),
                          owner.encode(), self._node_acl, 3)  # ephemeral | sequence  # fmt: skip
        result = self.client.handler.async_result()
        self.client._call(request, result)  # a closed client sets its error on `result`
        return result

    def _create_abandoned(self, created: Any, parent: str, token: str) -> None:
        """A create whose reply nobody waits for any more (it timed out, or its caller
        is gone): whatever it makes must go. Left to the cleaner, and followed: when
        its reply comes, the node it made is deleted. (The cleaner's own listing may
        have timed out as well, on a connection that lives on: nothing else would look
        again while it does, and the node would hold the lock.)"""
        self._leave(parent, token)

        def answered(result: Any) -> None:  # on kazoo's completion thread
            if result.successful():
                path = self.client.unchroot(result.value[0])
                self._run_in_background(self._delete_steps(parent, path, token))

        created.rawlink(answered)

    def _parent_steps(self, parent: str) -> Steps[None]:
        request = _CreateContainer(
            _prefix_root(self.client.chroot, parent), b"", self._parent_acl, 4
        )
        result = self.client.handler.async_result()
        with self._translated():
            try:
                self.client._call(request, result)
                yield result
            except NodeExistsError:
                pass
            except NoNodeError:  # the root itself is missing
                yield self.client.ensure_path_async(self.root, acl=self._parent_acl)
                yield from self._parent_steps(parent)

    def _turn_steps(
        self, parent: str, node: str, deadline: float | None, children: list[str]
    ) -> Steps[bool]:
        """Wait until `node` is the lowest child of `parent` (`children` is the list read
        with the create); False if `deadline` passed. One watch at a time, on the
        predecessor: a new one only when the predecessor changes or the watch fired."""
        ours = node.rsplit("/", 1)[1]
        watched: str | None = None  # the predecessor our pending watch is on
        fired: Signal | None = None  # set by that watch's event
        relisted: list[Any] = []
        while True:
            queue = _queue(children)
            if ours not in queue:
                raise self._unavailable(SessionExpiredError(f"{node} vanished while waiting"))
            position = queue.index(ours)
            if position == 0:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            predecessor = queue[position - 1]
            present = True
            if fired is None or predecessor != watched or fired.is_set():
                fired, relisted = self._new_signal(), []

                def on_change(
                    _event: Any, fired: Signal = fired, relisted: list[Any] = relisted
                ) -> None:
                    # on kazoo's event thread: ask for the new queue before waking the
                    # waiter, so the request is on the wire while it is being scheduled
                    relisted.append(self.client.get_children_async(parent))
                    fired.set()

                with self._translated():
                    stat = yield self.client.exists_async(f"{parent}/{predecessor}",
                                                          watch=on_change)  # fmt: skip
                watched, present = predecessor, stat is not None
            if present:
                yield Pause(fired, _RECHECK if remaining is None else min(remaining, _RECHECK))
            with self._translated():
                children = yield relisted[0] if relisted else self.client.get_children_async(parent)

    def _delete_steps(self, parent: str, node: str, token: str) -> Steps[bool]:
        """Delete our node; False if it was already gone. If ZooKeeper does not answer
        (or its caller stops waiting), the node is remembered and deleted once it
        does."""
        try:
            with self._translated():
                try:
                    yield self.client.delete_async(node)
                except NoNodeError:
                    return False
            return True
        except (BackendUnavailable, GeneratorExit):
            self._leave(parent, token)
            raise

    def _leave(self, parent: str, token: str) -> None:
        """Remember a node of ours that must go once ZooKeeper answers. If the connection
        is back already (its listener ran before this and found nothing to clean), clean
        now, in the background: a node left in a live session holds the lock for as long
        as the session lives, with nobody to release it."""
        with self._state_lock:
            self._leftovers.add((parent, token))
            clean = self._start_cleaner()
        if clean:
            self._run_in_background(self._cleaning_steps())

    def _start_cleaner(self) -> bool:
        """Whether to start the background cleaner now (under `_state_lock`): connected,
        nodes left, and none running (one per failed call would flood the connection)."""
        start = not self._in_doubt and bool(self._leftovers) and not self._cleaning
        self._cleaning = self._cleaning or start
        return start

    def _cleaning_steps(self) -> Steps[None]:
        """Pass over the nodes left while each pass gets somewhere; when ZooKeeper stops
        answering, the next reconnection (or acquire) takes over."""
        while True:
            connections, before = self._connections, set(self._leftovers)
            try:
                yield from self._clean_steps()
                refused = False
            except LockError:  # an answer other than "unavailable": leave it to a caller
                refused = True
            with self._state_lock:
                stuck = bool(before & self._leftovers) and connections == self._connections
                if refused or stuck or self._in_doubt or not self._leftovers:
                    self._cleaning = False
                    return

    def _clean_steps(self) -> Steps[None]:
        for parent, token in list(self._leftovers):
            try:
                with self._translated():
                    try:
                        children = yield self.client.get_children_async(parent)
                    except NoNodeError:
                        children = []
                    for child in children:
                        if child.startswith(token + "-"):
                            with contextlib.suppress(NoNodeError):
                                yield self.client.delete_async(f"{parent}/{child}")
            except BackendUnavailable:
                return  # the next reconnection tries again
            self._leftovers.discard((parent, token))

    # -- what the primitives send -------------------------------------------------------

    def _release_steps(self, lease: Lease) -> Steps[bool]:
        self._born_in.pop(lease.token, None)
        node = self._drop_node(lease.token)
        if node is None:
            return False
        return (yield from self._delete_steps(self._parent(lease.key), node, lease.token))

    def _drop_node(self, token: str) -> str | None:
        """Forget the node of the grant `token` and its watch; the node, if known."""
        watch = self._node_watches.pop(token, None)
        if watch is not None:
            self._unwatch_node(watch)
        return self._nodes.pop(token, None)

    def _release_unknown_steps(self, lease: Lease) -> Steps[bool]:
        """The node is named after the token: find it and delete it (now, or once
        ZooKeeper answers again)."""
        self._leftovers.add((self._parent(lease.key), lease.token))
        before = len(self._leftovers)
        yield from self._connect_steps()
        yield from self._clean_steps()
        return len(self._leftovers) < before

    def _is_held_steps(self, lease: Lease) -> Steps[bool]:
        node = self._nodes.get(lease.token)
        if node is None:
            return False
        yield from self._connect_steps()
        with self._translated():
            return (yield self.client.exists_async(node)) is not None

    def _head_steps(self, key: str) -> Steps[tuple[str, Holder] | None]:
        """The node that holds `key` and who it is, or None: nobody."""
        yield from self._connect_steps()
        parent = self._parent(key)
        for _ in range(3):  # the head may be deleted between the list and the read
            with self._translated():
                try:
                    queue = _queue((yield self.client.get_children_async(parent)))
                except NoNodeError:  # no parent: nobody holds it, or ever waited
                    return None
                if not queue:
                    return None
                node = f"{parent}/{queue[0]}"
                try:
                    data, stat = yield self.client.get_async(node)
                except NoNodeError:
                    continue
            owner = data.decode(errors="replace")
            holder = Holder(key, self.name, owner, None, int(stat.czxid), None, len(queue) - 1)
            return node, holder
        return None

    def _holder_steps(self, key: str) -> Steps[Holder | None]:
        head = yield from self._head_steps(key)
        return None if head is None else head[1]

    def _break_steps(self, key: str) -> Steps[Holder | None]:
        """Delete the holder's node. The next holder's node is created after, so its
        fence (czxid) is higher."""
        head = yield from self._head_steps(key)
        if head is None:
            return None
        node, holder = head
        with self._translated():
            try:
                yield self.client.delete_async(node)
            except NoNodeError:
                return None  # released meanwhile
        return holder

    def _ping_steps(self) -> Steps[None]:
        yield from self._connect_steps()
        with self._translated():
            yield self.client.exists_async("/")


@functools.lru_cache(maxsize=4096)
def _parent_of(root: str, key: str) -> str:
    """The lock parent of `key` (quoting a name costs more than a cached lookup)."""
    return f"{root}/{zookeeper_node_name(key)}"


def _tls_options(
    ca: str | os.PathLike[str] | None,
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
    key_password: str | None,
    check_hostname: bool,
) -> dict[str, Any]:
    """kazoo's TLS arguments (none without TLS): checked, its files loaded, verifying by
    default."""
    settings = tls_settings(ca, cert, key, key_password, check_hostname)
    if settings is None:
        return {}
    if "check_hostname" not in inspect.signature(KazooClient).parameters:
        raise ConfigError("tls_*: TLS needs kazoo>=2.11 (before, kazoo never checks the host "
                          "name): pip install 'kazoo>=2.11'")  # fmt: skip
    settings.checked()
    # never None: OpenSSL would ask for an encrypted key's password on the terminal
    return {"use_ssl": True, "ca": settings.ca, "certfile": settings.cert,
            "keyfile": settings.key, "keyfile_password": settings.key_password or "",
            "verify_certs": True, "check_hostname": settings.check_hostname}  # fmt: skip


def _acls(auth: str, username: str | None, password: str | None) -> tuple[list[ACL], list[ACL]]:
    """The ACLs of lock parents and of lock nodes. ZooKeeper's ACLs are per node and not
    inherited: creating or deleting a child needs CREATE or DELETE on its parent, so
    every node is given its own, never kazoo's open default. A SASL identity is named
    by its user alone (`sasl:<username>`): the server checked the password."""
    if username is None or password is None:
        return list(OPEN_ACL_UNSAFE), list(OPEN_ACL_UNSAFE)
    if auth == "sasl":
        parent = make_acl("sasl", username, read=True, create=True, delete=True)
        return [parent], [make_acl("sasl", username, read=True)]
    parent = make_digest_acl(username, password, read=True, create=True, delete=True)
    return [parent], [make_digest_acl(username, password, read=True)]


def _queue(children: list[str]) -> list[str]:
    """The lock's children in the order they are served: by sequence number."""
    return sorted(
        (child for child in children if child[-_SEQUENCE_DIGITS:].isdigit()),
        key=lambda child: child[-_SEQUENCE_DIGITS:],
    )
