"""Decisions written once for both faces: a decision that needs a server call (a chain's
walk down its tiers, a queued release, a quorum's vote) is a generator that yields the
call as a value (`Call`, calls made at once: `Each`, or a pause: `Sleep`) and is sent
its result, or thrown its error. The threaded face makes each call on the calling
thread (`run`); the asyncio face awaits it (`run_async`). So the logic of when to
degrade, retry, vote, wait or give up has one copy."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from locks.aio.owner import acting_for_task

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


@dataclass(frozen=True, slots=True)
class Each:
    """Calls made at once on behalf of `owner`; sent back as {name: what the call
    returned, or the exception it raised}: one call's error is an outcome, not a throw.
    `heard(name, outcome)` is told of each call that returned, as it returns: an
    asyncio caller cancelled before the round ends still learns what it was granted."""

    calls: Mapping[str, Call]
    owner: str
    heard: Callable[[str, Any], None] | None = None


Steps = Generator[Call | Each | Sleep, Any, R]
EachRunner = Callable[[Each], dict[str, Any]]


def call(target: object, method: str, *args: Any, **kwargs: Any) -> Generator[Call, Any, Any]:
    """`result = yield from call(provider, "acquire", key, ttl=...)`."""
    return (yield Call(target, method, args, kwargs or None))


def run(steps: Steps[R], each: EachRunner | None = None) -> R:
    """Drive `steps` on this thread: each call made plainly, each pause slept, calls at
    once made by `each` (the threaded face's choice of threads or split requests)."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    result = None
                elif isinstance(step, Each):
                    if each is None:
                        raise TypeError("these steps make calls at once: run them with `each`")
                    result = each(step)
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
                elif isinstance(step, Each):
                    result = await _each_async(step)
                else:
                    outcome = getattr(step.target, step.method)(*step.args, **(step.kwargs or {}))
                    result = await outcome if inspect.isawaitable(outcome) else outcome
            except BaseException as error:
                step = steps.throw(error)
                continue
            step = steps.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _each_async(step: Each) -> dict[str, Any]:
    """`step`'s calls as tasks of their own, each acting for its owner. A caller
    cancelled meanwhile cancels them and waits for them to end (a cancelled provider
    call cleans up after itself; what one granted before was `heard`)."""
    calls = step.calls.items()
    tasks = {name: asyncio.ensure_future(_one(step, name, made)) for name, made in calls}
    if not tasks:
        return {}
    try:
        await asyncio.wait(tasks.values())
    except asyncio.CancelledError:
        for task in tasks.values():
            task.cancel()
        await asyncio.wait(tasks.values())
        raise
    return {name: _outcome(task) for name, task in tasks.items()}


async def _one(step: Each, name: str, made: Call) -> Any:
    with acting_for_task(step.owner):
        try:
            outcome = getattr(made.target, made.method)(*made.args, **(made.kwargs or {}))
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception as error:
            return error
    if step.heard is not None:
        step.heard(name, outcome)
    return outcome


def _outcome(task: asyncio.Future[Any]) -> Any:
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()
