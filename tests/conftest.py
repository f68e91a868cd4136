from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from locks.events import Event, add_observer, remove_observer
from tests.backends import SERVERS, Backend

# ZooKeeper with SASL (tests/servers/zookeeper_sasl.py) is a plugin of its own
pytest_plugins = ["tests.servers", "tests.servers.zookeeper_sasl"]


@pytest.fixture(params=list(SERVERS))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each backend (and a chain) in turn; tests narrow the list with
    `@pytest.mark.parametrize("backend", kinds(...), indirect=True)`."""
    kind: str = request.param
    urls = [request.getfixturevalue(fixture).url for fixture in SERVERS[kind]]
    backend = Backend(kind, "|".join(urls) or None)
    yield backend
    backend.close()


@pytest.fixture
def key() -> str:
    """A lock name no other test uses."""
    return f"test:{uuid.uuid4().hex}"


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event emitted while the test runs."""
    seen: list[Event] = []
    add_observer(seen.append)
    yield seen
    remove_observer(seen.append)
