"""A throwaway PKI for the TLS tests, made at test time with the `openssl` command: a
CA, the servers' certificate for 127.0.0.1 and localhost, one whose only name is
`wronghost` (a host-name mismatch), a second CA that signed nothing the servers use (a
wrong CA) and a client certificate (CN `certuser`: PostgreSQL's `cert` method and
MariaDB's REQUIRE X509 match it). Keys are RSA in PKCS#8 PEM, which ZooKeeper's PEM
key store reads as they are.

Loaded as a pytest plugin (tests/servers/__init__.py) for its session fixture `pki`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CLIENT_CN = "certuser"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    directory: Path
    ca: Path  # the CA every server and the client certificate chain to
    ca_key: Path
    other_ca: Path  # a CA nobody's certificate chains to
    server: Pair  # SAN IP:127.0.0.1, DNS:localhost
    wronghost: Pair  # SAN DNS:wronghost only
    client: Pair  # CN certuser, for clientAuth

    def keystore(self, pair: Pair) -> Path:
        """Key and certificate in one PEM file (ZooKeeper's `ssl.keyStore.type=PEM`)."""
        path = self.directory / f"{pair.cert.stem}-keystore.pem"
        if not path.exists():
            path.write_bytes(pair.key.read_bytes() + pair.cert.read_bytes())
        return path


def _openssl(directory: Path, *args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("openssl is not installed; install it with: apt-get install -y openssl",
                    pytrace=False)  # fmt: skip
    done = subprocess.run([binary, *args], cwd=directory, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
             "-keyout", key.name, "-out", cert.name, "-days", "30", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, cn: str, extensions: str, ca: tuple[Path, Path]) -> Pair:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    _openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-sha256",
             "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={cn}")  # fmt: skip
    ext.write_text(extensions)
    _openssl(directory, "x509", "-req", "-in", csr.name, "-CA", ca[0].name,
             "-CAkey", ca[1].name, "-CAcreateserial", "-out", cert.name, "-days", "30",
             "-sha256", "-extfile", ext.name)  # fmt: skip
    return Pair(cert, key)


def make_pki(directory: Path) -> PKI:
    """Every certificate the TLS tests use, in `directory`."""
    ca = _ca(directory, "ca")
    other_ca = _ca(directory, "other-ca")
    server_usage = "extendedKeyUsage=serverAuth,clientAuth\n"
    server = _leaf(directory, "server", "localhost",
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\n" + server_usage, ca)  # fmt: skip
    wronghost = _leaf(directory, "wronghost", "wronghost",
                      "subjectAltName=DNS:wronghost\n" + server_usage, ca)  # fmt: skip
    client = _leaf(directory, "client", CLIENT_CN, "extendedKeyUsage=clientAuth\n", ca)
    for path in directory.iterdir():
        path.chmod(0o644 if path.suffix == ".crt" else 0o600)
    return PKI(directory, ca[0], ca[1], other_ca[0], server, wronghost, client)


def encrypted(pki: PKI, pair: Pair, password: str) -> Pair:
    """`pair` with its key encrypted under `password` (AES-256, PKCS#8)."""
    tag = hashlib.sha256(password.encode()).hexdigest()[:8]  # one file per password
    key = pki.directory / f"{pair.key.stem}-encrypted-{tag}.key"
    if not key.exists():
        _openssl(pki.directory, "pkey", "-in", pair.key.name, "-aes256", "-passout",
                 f"pass:{password}", "-out", key.name)  # fmt: skip
        key.chmod(0o600)
    return Pair(pair.cert, key)


@pytest.fixture(scope="session")
def pki() -> Iterator[PKI]:
    with tempfile.TemporaryDirectory(prefix="locks-pki-") as path:
        yield make_pki(Path(path))
