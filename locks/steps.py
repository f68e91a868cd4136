"""Decisions written once for both faces: a decision that needs a server call (a chain's
walk down its tiers, a queued release) is a generator that yields the call as a value
(`Call`, or a pause: `Sleep`) and is sent its result, or thrown its error. The threaded
face makes each call on the calling thread (`run`); the asyncio face awaits it
(`run_async`). So the logic of when to degrade, retry, wait or give up has one copy."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Call:
    """`target.method(*args, **kwargs)`, made by the face (awaited where it returns an
    awaitable)."""

    target: object
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Steps = Generator[Call | Sleep, Any, R]


def call(target: object, method: str, *args: Any, **kwargs: Any) -> Generator[Call, Any, Any]:
    """`result = yield from call(provider, "acquire", key, ttl=...)`."""
    return (yield Call(target, method, args, kwargs or None))


def run(steps: Steps[R]) -> R:
    """Drive `steps` on this thread: each call made plainly, each pause slept."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    result = None
                else:
                    result = getattr(step.target, step.method)(*step.args, **(step.kwargs or {}))
            except BaseException as error:  # the generator decides: it may catch it
                step = steps.throw(error)
                continue
            step = steps.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def run_async(steps: Steps[R]) -> R:
    """Drive `steps` on the running loop: each call awaited (a plain method, e.g. an
    asyncio provider's `bound`, is just called), each pause an `asyncio.sleep`."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    result = None
                else:
                    outcome = getattr(step.target, step.method)(*step.args, **(step.kwargs or {}))
                    result = await outcome if inspect.isawaitable(outcome) else outcome
            except BaseException as error:
                step = steps.throw(error)
                continue
            step = steps.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
