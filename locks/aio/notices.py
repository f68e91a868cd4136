"""PostgreSQL's LISTEN/NOTIFY for the asyncio database face: as `locks.backends.notices`
(same channel, same rules: nothing here is needed for correctness), with the listening
connection read by a task on the loop instead of a thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from locks.aio.dbpool import Connection
from locks.backends.notices import _LOOK, _RETRY, listen_to

logger = logging.getLogger("locks")


class AsyncNotices:
    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        close: Callable[[Connection], Awaitable[None]],
        channel: str,
        *,
        on_notice: Callable[[str], None],
        on_gap: Callable[[], None],
        timeout: float,
    ) -> None:
        self._connect, self._close = connect, close
        self._channel = channel
        self._on_notice, self._on_gap = on_notice, on_gap
        self._timeout = timeout
        self.reset()

    def reset(self) -> None:
        """Nothing started yet (also in a forked child: the task was the parent's)."""
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._closed = False

    async def listen(self) -> bool:
        """Make sure this provider is subscribed; whether it is (False: not within the
        timeout, so the caller polls)."""
        if self._listening.is_set():
            return True
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            async with asyncio.timeout(self._timeout):
                await self._listening.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while not self._closed:
            connection = None
            try:
                connection = await self._connect()
                await connection.driver.execute(listen_to(self._channel))
                self._listening.set()
                while not self._closed:
                    async for notice in connection.driver.notifies(timeout=_LOOK):
                        self._on_notice(notice.payload)
            except Exception as error:  # a broken connection, whatever the driver says
                logger.debug("listening for lock releases stopped: %s", error)
            finally:
                self._listening.clear()
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await self._close(connection)
            if not self._closed:
                self._on_gap()  # what was released meanwhile was not heard of
                await asyncio.sleep(_RETRY)
