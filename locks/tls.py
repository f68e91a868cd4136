"""TLS failures that mean misconfiguration, never an outage: a certificate that does not
verify (another CA, another host name, expired), a server that refuses our client
certificate or its absence, a peer that does not speak TLS where we do. Drivers report
them as connection errors (redis-py's `ConnectionError`, PyMySQL's 2003, kazoo's
time-out), which would degrade a chain on a mistake no retry fixes.

`tls_refused` reads the error a driver raised; `handshake_refusal` is a handshake of
our own, for a driver that hides the reason (kazoo retries every TLS failure as if the
server were down; redis-py's Sentinel and Cluster clients keep only the text), and
`HandshakeProbe` asks it at most once a second. `tls_settings` checks the `tls_*`
keywords every backend that takes them shares.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# OpenSSL's reasons (`SSLError.reason`) that only a peer that is up and refuses us, or
# our own TLS settings, can cause. Never an EOF, a reset or a time-out: a server that
# dies mid-handshake causes those too.
_REFUSED_REASONS = frozenset(
    {
        "CERTIFICATE_VERIFY_FAILED",  # ours: another CA, another host name, expired
        "TLSV1_ALERT_UNKNOWN_CA",  # the server's: our certificate is from a CA it does not know
        "SSLV3_ALERT_BAD_CERTIFICATE",  # refused our certificate (Java: also a missing one)
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",  # no client certificate where one is required
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",  # no version, cipher or certificate in common
        "TLSV1_ALERT_PROTOCOL_VERSION",
        "UNSUPPORTED_PROTOCOL",
        "WRONG_VERSION_NUMBER",  # the peer answered in plaintext: TLS against a plain port
        "KEY_VALUES_MISMATCH",  # our client key is not our certificate's
    }
)
_CHAIN_MAX = 16  # links of __cause__/__context__ read at most (a chain may loop)
# after a TLS 1.3 handshake the server judges our certificate: its verdict (an alert)
# comes with the first read, at once on a server that is up
_VERDICT_WAIT = 0.2


def tls_refused(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from (`__cause__`, `__context__`),
    is a TLS failure only misconfiguration causes: a certificate that does not verify,
    or a handshake the peer refused (an alert about certificates or versions), or a
    peer answering TLS in plaintext. Never for an EOF, a reset or a time-out."""
    return any(
        isinstance(current, ssl.SSLCertVerificationError)
        or (
            isinstance(current, ssl.SSLError)
            and getattr(current, "reason", None) in _REFUSED_REASONS
        )
        for current in error_chain(error)
    )


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and the errors it was raised from or while handling (`__cause__`,
    `__context__`), breadth first: drivers wrap the server's reason in their own."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending and len(seen) < _CHAIN_MAX:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]


def handshake_refusal(
    addresses: Sequence[tuple[str, int]], context: ssl.SSLContext, timeout: float
) -> tuple[str, ssl.SSLError] | None:
    """One TLS handshake with `context` to the first of `addresses` that takes a TCP
    connection (its host as the name to verify), within `timeout`: that address and
    the error if TLS refused us (`tls_refused`); None if the handshake passed, no
    address took a connection, or the peer went quiet or away (an outage, maybe)."""
    deadline = time.monotonic() + timeout
    for host, port in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            sock = socket.create_connection((host, port), timeout=left)
        except OSError:
            continue  # refused, unreachable: the next one
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            with context.wrap_socket(sock, server_hostname=host) as tls:
                if tls.version() == "TLSv1.3":
                    tls.settimeout(max(min(_VERDICT_WAIT, deadline - time.monotonic()), 0.001))
                    tls.recv(1)
        except ssl.SSLError as error:
            return (f"{host}:{port}", error) if tls_refused(error) else None
        except OSError:
            return None  # timed out, reset: no verdict
        finally:
            sock.close()
        return None
    return None


_PROBE_EVERY = 1.0  # seconds between two handshakes of `HandshakeProbe`


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """The `tls_*` keywords, checked: the chain is always verified, the host name unless
    `check_hostname` is False. The key's password never shows in a repr."""

    ca: str | None
    cert: str | None
    key: str | None
    key_password: str | None = field(repr=False)
    check_hostname: bool

    def context(self) -> ssl.SSLContext:
        """A client context with these settings; the system's CAs are trusted too, as
        the drivers do. A file missing or unreadable, or a key that is not the
        certificate's, raises OSError or ssl.SSLError."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        if self.ca:
            context.load_verify_locations(self.ca)
        if self.cert and self.key:
            # never None: OpenSSL would ask for an encrypted key's password on the tty
            context.load_cert_chain(self.cert, self.key, password=self.key_password or _none)
        return context

    def checked(self) -> TLSSettings:
        """These settings, once their files load. A file missing or unreadable, a key
        that is not the certificate's or that its password does not open is a
        ValueError here, before any I/O: drivers report it as a connection error at the
        first call, which a chain would take for an outage."""
        try:
            self.context()
        except OSError as error:  # ssl.SSLError is one
            files = ", ".join(path for path in (self.ca, self.cert, self.key) if path)
            raise ValueError(
                f"TLS: the files ({files}) do not load: {error} (an encrypted key needs its "
                "password, tls_key_password or a url's ssl_password; the key must be the "
                "certificate's)"
            ) from None
        return self


def _none() -> bytes:
    """The password of a key given none: empty, so an encrypted key fails to load."""
    return b""


def tls_settings(
    ca: str | os.PathLike[str] | None,
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
    key_password: str | None,
    check_hostname: bool,
) -> TLSSettings | None:
    """The TLS the keywords ask for, or None for none: a CA or a client certificate
    turns TLS on. Checked before any I/O; a ValueError or TypeError names the keyword."""
    paths: dict[str, str | None] = {}
    for option, value in (("tls_ca", ca), ("tls_cert", cert), ("tls_key", key)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{option} must be a path, not {type(value).__name__}")
        path = None if value is None else os.fspath(value)
        if path == "":
            raise ValueError(f"{option} must be a path, not empty")
        paths[option] = path
    if not isinstance(check_hostname, bool):
        raise TypeError(f"tls_check_hostname must be true or false, got {check_hostname!r}")
    if key_password is not None and not isinstance(key_password, str):
        raise TypeError(f"tls_key_password must be a str, not {type(key_password).__name__}")
    if (paths["tls_cert"] is None) != (paths["tls_key"] is None):
        raise ValueError("tls_cert and tls_key: give both, or neither")
    if key_password and paths["tls_key"] is None:
        raise ValueError("tls_key_password is the password of tls_key: give tls_key too")
    if paths["tls_ca"] is None and paths["tls_cert"] is None:
        if not check_hostname:
            raise ValueError("tls_check_hostname is for TLS: give tls_ca (or tls_cert)")
        return None
    return TLSSettings(paths["tls_ca"], paths["tls_cert"], paths["tls_key"],
                       key_password or None, check_hostname)  # fmt: skip


class HandshakeProbe:
    """Handshakes of our own for a driver that hides why it reached no server, asked at
    most once a second (calls meanwhile get the last verdict; a call while another
    probes does not wait for it), so an outage costs one extra connection a second, not
    one a call."""

    def __init__(self, addresses: Sequence[tuple[str, int]], timeout: float) -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._probed_at: float | None = None
        self._verdict: Any = None

    def refusal(self, context: ssl.SSLContext) -> tuple[str, ssl.SSLError] | None:
        """For a TLS client: the address that refused our TLS and why, or None."""
        verdict: tuple[str, ssl.SSLError] | None = self._ask(
            lambda: handshake_refusal(self.addresses, context, self.timeout)
        )
        return verdict

    def speaks_tls(self, hello: bytes) -> str | None:
        """For a plaintext client: the first address that serves TLS only, or None
        (`hello`: a plaintext request its protocol answers at once)."""
        verdict: str | None = self._ask(lambda: tls_answer(self.addresses, self.timeout, hello))
        return verdict

    def _ask(self, check: Callable[[], Any]) -> Any:
        probed_at = self._probed_at
        now = time.monotonic()
        if (probed_at is None or now - probed_at >= _PROBE_EVERY) and self._lock.acquire(
            blocking=False
        ):
            try:
                self._verdict = check()
                self._probed_at = time.monotonic()
            finally:
                self._lock.release()
        return self._verdict


def tls_answer(addresses: Sequence[tuple[str, int]], timeout: float, hello: bytes) -> str | None:
    """The first of `addresses` that takes a TCP connection and serves TLS only, within
    `timeout`: a plaintext client's server. A plaintext `hello` first (a server that
    answers it in its own protocol is no TLS server: told at once, never waited on);
    only on an EOF, a reset or a TLS alert, a handshake, which such a server completes
    or refuses with an alert (one that wants our certificate). None otherwise."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # whether it speaks TLS, not whom we trust
    deadline = time.monotonic() + timeout
    for host, port in addresses:
        try:
            answer = _answer(host, port, hello, deadline)
        except OSError:
            continue  # refused, unreachable: the next one
        if answer and answer[0] != _TLS_ALERT:
            return None  # it answered in plaintext
        try:
            with socket.create_connection((host, port), timeout=_left(deadline)) as sock:
                sock.settimeout(_left(deadline))
                with context.wrap_socket(sock, server_hostname=host):
                    return f"{host}:{port}"
        except ssl.SSLError as error:
            alert = "ALERT" in str(getattr(error, "reason", "") or "")
            return f"{host}:{port}" if alert else None
        except OSError:
            return None
    return None


_TLS_ALERT = 0x15  # the content type of a TLS alert record


def _answer(host: str, port: int, hello: bytes, deadline: float) -> bytes:
    """The first bytes `host:port` answers `hello` with; b"" for an EOF or a reset. A
    refused connection raises OSError."""
    with socket.create_connection((host, port), timeout=_left(deadline)) as sock:
        sock.settimeout(_left(deadline))
        try:
            sock.sendall(hello)
            return sock.recv(16)
        except (ConnectionError, TimeoutError):
            return b""


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)
