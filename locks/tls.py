"""TLS failures that mean misconfiguration, never an outage: a certificate that does not
verify (another CA, another host name, expired), a server that refuses our client
certificate or its absence, a peer that does not speak TLS where we do. Drivers report
them as connection errors (redis-py's `ConnectionError`, PyMySQL's 2003, kazoo's
time-out), which would degrade a chain on a mistake no retry fixes.

`tls_refused` reads the error a driver raised; `handshake_refusal` is a handshake of
our own, for a driver that hides the reason (kazoo retries every TLS failure as if the
server were down).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence

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
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending and len(seen) < _CHAIN_MAX:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if isinstance(current, ssl.SSLError) and getattr(current, "reason", None) in (
            _REFUSED_REASONS
        ):
            return True
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return False


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
