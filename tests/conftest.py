from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.backends import CLASSES, SERVERS, Backend

pytest_plugins = ["tests.servers"]


@pytest.fixture(params=list(CLASSES))
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each backend in turn; tests narrow the list with
    `@pytest.mark.parametrize("backend", kinds(...), indirect=True)`."""
    kind: str = request.param
    server_fixture = SERVERS[kind]
    address = None
    if server_fixture is not None:
        address = request.getfixturevalue(server_fixture).url
    backend = Backend(kind, address)
    yield backend
    backend.close()


@pytest.fixture
def key() -> str:
    """A lock name no other test uses."""
    return f"test:{uuid.uuid4().hex}"
