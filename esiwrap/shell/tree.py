"""The child's process tree while it is being stopped: who is left, and a wake-up when one exits.

The tree is the child's descendants as seen when the stop began plus whatever is below esiwrap
now (orphans are re-parented to it, the child subreaper). Each remaining process gets a pidfd in
the supervisor's selector, so the loop wakes the moment one exits instead of polling.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from typing import TYPE_CHECKING

from esiwrap.shell import process

if TYPE_CHECKING:
    import psutil


class ProcessTree:
    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        self._snapshot: list[psutil.Process] = []
        self._fds: dict[int, int] = {}  # pidfd -> pid

    def snapshot(self, child_pid: int) -> None:
        """Remember the child's descendants before anything is signalled."""
        self._snapshot = process.descendants(child_pid)

    def remaining(self) -> list[psutil.Process]:
        """Every process of the tree still running."""
        if not self._snapshot and not process.has_children():
            return []  # nothing was running below the child and nothing is below us: no walk
        current = process.descendants(os.getpid())
        by_pid = {p.pid: p for p in [*self._snapshot, *current]}
        return process.alive(by_pid.values())

    def watch(self, processes: list[psutil.Process]) -> None:
        """Wake the selector when any of these exits (kernels without pidfd: the caller polls)."""
        watched = set(self._fds.values())
        for proc in processes:
            if proc.pid in watched:
                continue
            fd = process.open_pidfd(proc.pid)
            if fd is None:
                continue
            self._fds[fd] = proc.pid
            self._selector.register(fd, selectors.EVENT_READ, self._on_exit)

    def close(self) -> None:
        for fd in list(self._fds):
            self._forget(fd)

    def _on_exit(self, key: selectors.SelectorKey) -> None:
        self._forget(int(key.fd))

    def _forget(self, fd: int) -> None:
        self._fds.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
