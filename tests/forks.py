"""Running a check in a forked child, for the tests of what a child may and may not do."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_forked_child(check: Callable[[], list[bool]]) -> list[bool]:
    """Run `check` in a forked child and return its verdicts; fail naming what it raised.
    The child leaves with `os._exit`, running no cleanup of its parent's objects."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            verdicts = check()
        except BaseException as exc:  # the parent reports it
            os.write(write, f"!{type(exc).__name__}: {exc}".encode()[:4000])
            os._exit(1)
        os.write(write, bytes(int(v) for v in verdicts))
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report = os.read(read, 4096)
    os.close(read)
    assert os.WEXITSTATUS(status) == 0, report.decode(errors="replace")
    return [bool(b) for b in report]
