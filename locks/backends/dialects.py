"""What differs between the databases and their drivers, in one place: the URLs people
write and the driver each picks, what each driver needs to keep a call within its
socket timeout, and which errors mean "refused", "read-only" or "run it again".

The statements themselves are the algorithm and live with it (`locks.backends.database`);
they differ by family only: `mysql` (MySQL and MariaDB), `postgresql`, `sqlite`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import ssl
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc

from locks.backends.dbpool import Refused
from locks.errors import ConfigError
from locks.tls import TLSSettings

# The driver a URL without `+driver` gets: the one its extra installs (SQLAlchemy's own
# defaults, mysqlclient and psycopg2, are not what `pip install fallback-locks[...]` brings).
# `postgres://` is what many hosting providers hand out; SQLAlchemy refuses that name.
_SCHEMES = {
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "sqlite": "sqlite+pysqlite",
}
_ALIASES = {"postgres": "postgresql"}  # with an explicit driver: postgres+psycopg2://

# driver (as in the URL) -> (the module it imports, what installs it)
_DRIVERS = {
    "pymysql": ("pymysql", "pip install 'fallback-locks[mysql]'"),
    "psycopg": ("psycopg", "pip install 'fallback-locks[postgresql]'"),
    "psycopg2": ("psycopg2", "pip install psycopg2-binary"),
    "mysqldb": ("MySQLdb", "pip install mysqlclient"),
    "mysqlconnector": ("mysql.connector", "pip install mysql-connector-python"),
    "mariadbconnector": ("mariadb", "pip install mariadb"),
    "asyncmy": ("asyncmy", "pip install 'fallback-locks[aio-mysql]'"),
    "aiomysql": ("aiomysql", "pip install aiomysql"),
    "pg8000": ("pg8000", "pip install pg8000"),
    "asyncpg": ("asyncpg", "pip install asyncpg"),
    "pysqlite": ("sqlite3", "a Python built with sqlite3"),
    "aiosqlite": ("aiosqlite", "pip install 'fallback-locks[aio-sqlite]'"),
}

FAMILIES = ("mysql", "postgresql", "sqlite")

# The asyncio face's driver for each family, and for a URL that names a threaded driver
# (one TOML serves both faces). asyncmy, not aiomysql: ~13 % more lock cycles a second
# against MariaDB here (docs/asyncio.md); psycopg 3 is asyncio-capable itself.
_ASYNC_DRIVERS = {"mysql": "asyncmy", "postgresql": "psycopg", "sqlite": "aiosqlite"}
_ASYNCIO = {"asyncmy", "aiomysql", "psycopg", "asyncpg", "aiosqlite"}

# errors meaning "the database cannot serve us now"
UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, exc.TimeoutError)
# MySQL/MariaDB and PostgreSQL refusing credentials or a privilege: a configuration
# error, never an outage (1044/1045 access to a database or as a user, 1142/1143 to a
# table or column, 1227/1370 a privilege, 1251 an auth plugin the client lacks, 1698 a
# socket-auth user, 1820/1862 an expired password, 2026 a TLS failure; PostgreSQL
# 28000/28P01 authentication, 42501 insufficient privilege)
_MYSQL_DENIED = {1044, 1045, 1142, 1143, 1227, 1251, 1370, 1698, 1820, 1862, 2026}
_PG_DENIED = {"28000", "28P01", "42501"}
# libpq reports a refused connection with no SQLSTATE (psycopg 3 and psycopg2 alike): the
# server's FATAL text, or libpq's own for TLS, is all there is (in the server's
# lc_messages; English is the default)
_PG_REFUSED = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \".*\" does not exist"
    r"|database \".*\" does not exist|permission denied for database"
    r"|no password supplied|certificate verify failed|does not match host name"
    r"|root certificate file|server does not support SSL|SSL error"
    r"|connection requires a valid client certificate"
)
# A server that refuses to write because it is read-only: an outage of this tier (a
# replica, a standby, a primary being demoted), never a data error. MySQL/MariaDB 1290
# ER_OPTION_PREVENTS_STATEMENT ("running with the --read-only option"; other options
# share the code, so the message decides), 1836 ER_READ_ONLY_MODE, 1792 a READ ONLY
# transaction; PostgreSQL 25006 read_only_sql_transaction (a hot standby, or
# default_transaction_read_only); SQLite 8 SQLITE_READONLY (a file we may not write).
_MYSQL_READ_ONLY = {1792, 1836}
_PG_READ_ONLY = "25006"
_SQLITE_READONLY = 8
READ_ONLY_HINT = {
    "mysql": "read_only: a replica, or a demoted primary",
    "postgresql": "read_only: a hot standby, or default_transaction_read_only",
    "sqlite": "read_only: a file it may not write",
}


def family(dialect_name: str) -> str:
    """The statements' family of a SQLAlchemy dialect (`mariadb` is MySQL's)."""
    return "mysql" if dialect_name == "mariadb" else dialect_name


def database_url(url: str) -> sa.engine.URL:
    """`url` parsed, its driver chosen (the one its extra installs, unless it names
    one) and installed: a `ValueError` for what is not a database URL, a `ConfigError`
    naming the package for a driver that is missing. Never shows the password."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, not {type(url).__name__}")
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise ValueError(f"url {redacted(url)!r} is not a database URL: no '://'")
    backend, plus, driver = scheme.partition("+")
    backend = _ALIASES.get(backend, backend)
    scheme = f"{backend}+{driver}" if plus else _SCHEMES.get(backend, backend)
    try:
        parsed = sa.engine.make_url(f"{scheme}://{rest}")
    except exc.ArgumentError as error:
        raise ValueError(f"url {redacted(url)!r} is not a database URL: {error}") from None
    name = parsed.get_backend_name()
    if family(name) not in FAMILIES:
        raise ValueError(
            f"url {redacted(url)!r}: unsupported database {name!r}: "
            "use MySQL/MariaDB, PostgreSQL or SQLite"
        )
    module, install = _DRIVERS.get(parsed.get_driver_name(), (parsed.get_driver_name(), ""))
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise ConfigError(
            f"url {redacted(url)!r} needs the {parsed.get_driver_name()} driver, whose "
            f"module {module!r} is not installed: {install or f'pip install {module}'}"
        )
    return parsed


def asyncio_url(url: str) -> sa.engine.URL:
    """`database_url` for the asyncio face: a threaded driver named in `url` (or none)
    becomes the family's asyncio driver; an asyncio driver named stays."""
    if not isinstance(url, str):
        return database_url(url)  # names the type
    scheme, separator, rest = url.partition("://")
    backend, _, driver = scheme.partition("+")
    asyncio_driver = _ASYNC_DRIVERS.get(family(_ALIASES.get(backend, backend)))
    if driver in _ASYNCIO or asyncio_driver is None or not separator:
        return database_url(url)  # as named, or not a database: it says what is wrong
    return database_url(f"{backend}+{asyncio_driver}://{rest}")


def connect_args(
    url: sa.engine.URL, connect_timeout: float, socket_timeout: float, given: dict[str, Any]
) -> dict[str, Any]:
    """What each driver needs so that no call outlives its timeouts (`given` wins), and
    TLS verified in full wherever it is asked for. The asyncio drivers have no read
    timeout: the asyncio face bounds each call itself."""
    args = dict(given)
    name, driver = family(url.get_backend_name()), url.get_driver_name()
    if name == "mysql":
        args.setdefault("connect_timeout", max(1, round(connect_timeout)))
        if driver not in _ASYNCIO:
            # a hung server holds a statement (and the handshake) this long, no longer
            args.setdefault("read_timeout", socket_timeout)
            args.setdefault("write_timeout", socket_timeout)
        if driver in ("pymysql", "asyncmy"):  # one url and connect_args for both faces
            _pymysql_tls(url, args)
        if driver == "asyncmy":
            _asyncmy_tls(url, args)
    elif name == "postgresql" and driver in ("psycopg", "psycopg2"):
        args.setdefault("connect_timeout", max(1, round(connect_timeout)))
        # a CA given means TLS verified in full: libpq's default (`prefer`) would take
        # plaintext, and nothing short of verify-full checks the host name
        asked = {**url.query, **given}
        if "sslrootcert" in asked and "sslmode" not in asked and "PGSSLMODE" not in os.environ:
            args["sslmode"] = "verify-full"
    elif name == "sqlite":
        # the file lock is the server here: waited for no longer than a reply elsewhere
        args.setdefault("timeout", socket_timeout)
    return args


# where each driver takes its TLS files: CA, certificate, key, the key's password
_TLS_FILES = {
    "mysql": ("ssl_ca", "ssl_cert", "ssl_key", "ssl_key_password"),
    "postgresql": ("sslrootcert", "sslcert", "sslkey", "sslpassword"),
}


def check_tls_files(url: sa.engine.URL, args: dict[str, Any]) -> None:
    """The TLS files load, before any I/O: a missing file, or a key its password does
    not open, would reach us as a connection error at the first call, which a chain
    takes for an outage."""
    keys = _TLS_FILES.get(family(url.get_backend_name()))
    if keys is None:
        return
    given = {k: v[-1] if isinstance(v, tuple) else v for k, v in {**url.query, **args}.items()}
    ssl = args.get("ssl")
    if isinstance(ssl, Mapping):  # PyMySQL's `ssl` dict
        given |= {f"ssl_{k}": ssl[k] for k in ("ca", "cert", "key") if k in ssl}
        given.setdefault("ssl_key_password", ssl.get("password"))
    ca, cert, key, password = (given.get(k) for k in keys)
    if ca == "system":  # libpq: the system's CAs
        ca = None
    if (cert is None) != (key is None):  # the driver's own defaults (~/.postgresql) fill in
        cert = key = None
    if ca or cert:
        TLSSettings(ca, cert, key, password, check_hostname=False).checked()


# PyMySQL's TLS options in a URL: SQLAlchemy folds these into the `ssl` dict, which
# verifies the chain and the host name
_URL_TLS = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_capath", "ssl_cipher", "ssl_check_hostname")
# PyMySQL's own TLS arguments: given any of them, it ignores that `ssl` dict
_PYMYSQL_TLS = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_key_password", "ssl_verify_cert",
                "ssl_verify_identity")  # fmt: skip
# PyMySQL's switches, read for their truth: a URL passes each as a non-empty string,
# true whatever it says (`?ssl_disabled=false` turns TLS off)
_PYMYSQL_SWITCHES = ("ssl_disabled", "ssl_verify_cert", "ssl_verify_identity")


def _pymysql_tls(url: sa.engine.URL, args: dict[str, Any]) -> None:
    """TLS asked for in `args` (PyMySQL's `ssl_ca`, `ssl_cert` or `ssl_key`) verifies the
    chain and the host name unless `args` says otherwise: alone, PyMySQL's `ssl_ca`
    verifies nothing. A switch written as a string, and TLS options in both the URL and
    `args` (PyMySQL would drop the URL's CA), are refused. asyncmy is given the same
    url and `args` (one TOML for both faces): decided here for both, then translated
    (`_asyncmy_tls`)."""
    for switch in _PYMYSQL_SWITCHES:
        if switch in url.query or isinstance(args.get(switch), str):
            where = "the url" if switch in url.query else "connect_args"
            raise ValueError(
                f"{switch} in {where}: PyMySQL reads any string as true ({switch}=false "
                f"would mean true); give {switch} = true or false in connect_args"
            )
    if "ssl_key_password" in url.query:  # SQLAlchemy passes it beside its `ssl` dict: unread
        raise ValueError(
            "ssl_key_password in a MySQL url: PyMySQL would not read it; give ssl_cert, "
            "ssl_key and ssl_key_password in connect_args"
        )
    in_url = [option for option in _URL_TLS if option in url.query]
    in_args = [option for option in _PYMYSQL_TLS if option in args]
    if in_url and in_args:
        raise ValueError(
            f"TLS options in both the url ({', '.join(in_url)}) and connect_args "
            f"({', '.join(in_args)}): PyMySQL would ignore the url's; give them in one place"
        )
    if any(args.get(option) for option in ("ssl_ca", "ssl_cert", "ssl_key")):
        args.setdefault("ssl_verify_cert", True)
        if args["ssl_verify_cert"]:  # PyMySQL would verify the chain for the host name
            args.setdefault("ssl_verify_identity", True)


def _asyncmy_tls(url: sa.engine.URL, args: dict[str, Any]) -> None:
    """PyMySQL's TLS arguments, as `_pymysql_tls` decided them, in the one form asyncmy
    takes: an `ssl.SSLContext`. asyncmy refuses PyMySQL's `ssl_*` keywords at the first
    connection, and its `ssl` dict has no key password (OpenSSL would ask for it on the
    terminal). Built as PyMySQL builds its own (the CA alone when given, else the
    system's; `ssl_disabled` turns off the url's TLS too), except that the host name is
    checked whenever `ssl_verify_identity` is, with or without a CA (PyMySQL drops the
    check without one). The url's form (SQLAlchemy's `ssl` dict) asyncmy reads as
    PyMySQL does: left to it."""
    own = args.get("ssl")
    if isinstance(own, Mapping) and own.get("password"):
        raise ValueError(
            "a password in connect_args' ssl dict: asyncmy would not read it (OpenSSL would "
            "ask on the terminal); give ssl_cert, ssl_key and ssl_key_password instead"
        )
    options = {k: args.pop(k) for k in (*_PYMYSQL_TLS, "ssl_disabled") if k in args}
    if options.get("ssl_disabled"):
        args["ssl"] = None  # PyMySQL's plaintext, whatever else asks for TLS
        return
    if not any(options.get(k) for k in _PYMYSQL_TLS if k != "ssl_key_password"):
        return  # no TLS asked for here: the url's, or a `ssl` of the caller's own, if any
    ca, cert, key, password = (options.get(k) for k in _TLS_FILES["mysql"])
    check_tls_files(url, {k: v for k, v in options.items() if k in _TLS_FILES["mysql"]})
    identity = bool(options.get("ssl_verify_identity"))
    verified = identity or bool(options.get("ssl_verify_cert"))  # PyMySQL's rule
    context = ssl.create_default_context(cafile=ca)
    # PyMySQL's too: what it accepts (MySQL's own self-signed certificates) must pass here
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    context.check_hostname = verified and identity
    context.verify_mode = ssl.CERT_REQUIRED if verified else ssl.CERT_NONE
    if cert:  # never no password: OpenSSL would ask for an encrypted key's on the terminal
        context.load_cert_chain(cert, key, password=password or (lambda: b""))
    args["ssl"] = context


# a TLS key's password: libpq's `sslpassword`, PyMySQL's `ssl_key_password`, the `ssl`
# dict's `password`
_KEY_PASSWORDS = ("sslpassword", "ssl_key_password")


def redacted(url: str) -> str:
    """`url` with any password replaced, for error messages."""
    url = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
    return re.sub(rf"([?&](?:{'|'.join(_KEY_PASSWORDS)})=)[^&]*", r"\1***", url)


def secrets(url: sa.engine.URL, connect_args: Mapping[str, Any]) -> list[str]:
    """Every secret of a connection: the password and a TLS key's password, from the
    url or `connect_args`."""
    found: list[Any] = [url.password]
    for key in _KEY_PASSWORDS:
        value = url.query.get(key)
        found += list(value) if isinstance(value, tuple) else [value]
        found.append(connect_args.get(key))
    ssl = connect_args.get("ssl")
    if isinstance(ssl, Mapping):
        found.append(ssl.get("password"))
    return [str(secret) for secret in found if secret]


def sqlstate(error: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE: `sqlstate` on psycopg 3, `pgcode` on psycopg2."""
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return state if isinstance(state, str) else None


def _driver_error(error: BaseException) -> BaseException:
    """The driver's own error (SQLAlchemy wraps it in `orig`)."""
    return getattr(error, "orig", None) or error


def _mysql_code(error: BaseException) -> object:
    return error.args[0] if error.args else None


def denied(error: BaseException) -> bool:
    """Credentials or a privilege refused: a configuration error, never an outage."""
    cause = _driver_error(error)
    if _mysql_code(cause) in _MYSQL_DENIED or sqlstate(cause) in _PG_DENIED:
        return True
    from_libpq = type(cause).__module__.startswith(("psycopg", "psycopg2"))
    return from_libpq and _PG_REFUSED.search(str(cause)) is not None


def read_only(error: BaseException) -> bool:
    """Whether `error` (or the driver's error it wraps) is a read-only server's refusal."""
    cause = _driver_error(error)
    if isinstance(cause, Refused):
        return True
    code = _mysql_code(cause)
    if code in _MYSQL_READ_ONLY or sqlstate(cause) == _PG_READ_ONLY:
        return True
    if code == 1290:
        return "read-only" in str(cause) or "read_only" in str(cause)
    sqlite_code = getattr(cause, "sqlite_errorcode", None)  # extended codes keep it below
    return isinstance(sqlite_code, int) and sqlite_code & 0xFF == _SQLITE_READONLY


def deadlock_victim(error: BaseException) -> bool:
    """InnoDB picks a victim when waiters that all saw a just-deleted row race to insert
    it (MySQL 1213); PostgreSQL reports 40P01, or 40001 for a serialization failure.
    Either way the statement was rolled back whole: it may run again."""
    return _mysql_code(error) == 1213 or sqlstate(error) in ("40P01", "40001")
