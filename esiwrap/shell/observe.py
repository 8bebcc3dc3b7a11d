"""The supervisor's window to the outside: metrics file, metrics endpoint and status file.

The supervisor hands every new `Snapshot` to `Observer.update()`; the observer writes the files
and serves the endpoint from the supervisor's own selector. Four calls, all from the loop:

    observer = Observer(selector, settings)        # before the child starts: a bad port is exit 2
    ... in the select timeout:   observer.next_wake(mono)  (None: no timer of its own)
    ... after every wake-up:     observer.tick(mono)       (expire slow clients, due writes)
    ... after every change:      observer.update(snapshot)
    observer.close()                               # on the way out: removes the files

Files are rewritten at once when something a person acts on changed (phase, deadline, planned
save, checkpoint, counters, trainers), and at most every `min_interval_s` for what moves with
every step (the step number, the step estimate, work at risk): a fast trainer does not turn
into a stream of fsyncs. A file that cannot be written is logged once and then left alone;
nothing here can stop a run.
"""

from __future__ import annotations

import selectors
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from esiwrap import __version__
from esiwrap import events as ev
from esiwrap.core.snapshot import Snapshot
from esiwrap.shell.files import MirroredFile
from esiwrap.shell.log import get_logger

if TYPE_CHECKING:  # the endpoint and the metrics text are imported only when asked for
    from esiwrap.shell.endpoint import HttpEndpoint, Page
    from esiwrap.shell.writer import FileWriter

MIN_INTERVAL_S = 1.0
# What changes with every step: rewritten at most every MIN_INTERVAL_S.
_VOLATILE = {"time": 0.0, "last_step": None, "work_at_risk_s": None, "step_estimate_s": None}


@dataclass(frozen=True)
class ObserveSettings:
    status_file: str | None = None  # None: no status file
    metrics_file: str | None = None
    metrics_port: int | None = None  # None: no endpoint; 0: any free port
    metrics_address: str = "127.0.0.1"
    min_interval_s: float = MIN_INTERVAL_S


class Observer:
    def __init__(self, selector: selectors.BaseSelector, settings: ObserveSettings,
                 writer: FileWriter | None = None) -> None:
        """`writer`: the thread that writes the files (the supervisor's: its loop never waits on a
        disk); without one they are written here."""
        self.settings = settings
        self.log = get_logger()
        # The status file lives as long as this process and is read by processes on this machine:
        # renamed into place, it needs no fsync (which costs milliseconds on a disk-backed /run).
        self._status = MirroredFile(settings.status_file, durable=False, writer=writer,
                                    done=self._file_written) if settings.status_file else None
        self._metrics = MirroredFile(settings.metrics_file, writer=writer,
                                     done=self._file_written) if settings.metrics_file else None
        self._latest: Snapshot | None = None
        self._written: Snapshot | None = None
        self._written_mono = float("-inf")
        self._due_mono: float | None = None  # a held-back write
        self._failed: dict[str, str] = {}  # path -> the error last logged
        self.endpoint: HttpEndpoint | None = None
        if settings.metrics_port is not None:
            from esiwrap.shell.endpoint import HttpEndpoint

            self.endpoint = HttpEndpoint(selector, settings.metrics_address, settings.metrics_port,
                                         self._page)
            host, port = self.endpoint.address
            self.log.info(ev.METRICS_SERVING, url=self.endpoint.url + "/metrics", address=host, port=port)

    # ------------------------------------------------------------------ the loop's calls
    def update(self, snapshot: Snapshot, mono: float | None = None) -> None:
        """The supervisor's latest state: files now, or within min_interval_s if only step-level
        figures moved; the endpoint always answers with the latest."""
        mono = time.monotonic() if mono is None else mono
        if self._latest is not None and replace(self._latest, time=snapshot.time) == snapshot:
            return  # nothing changed but the clock: the snapshot keeps the time of its last change
        self._latest = snapshot
        if self._written is None or _significant(self._written, snapshot) or \
                mono - self._written_mono >= self.settings.min_interval_s:
            self._write_files(mono)
        elif self._due_mono is None:
            self._due_mono = self._written_mono + self.settings.min_interval_s

    def next_wake(self, mono: float) -> float | None:
        """The monotonic time this wants `tick` called by (None: nothing pending)."""
        wakes = [w for w in (self._due_mono, self.endpoint.next_wake() if self.endpoint else None)
                 if w is not None]
        return min(wakes) if wakes else None

    def tick(self, mono: float) -> None:
        """Housekeeping on every wake: close timed-out clients, write what was held back."""
        if self.endpoint is not None:
            self.endpoint.expire(mono)
        if self._due_mono is not None and mono >= self._due_mono:
            self._write_files(mono)

    def close(self) -> None:
        """Stop serving and remove the files: what they say is no longer true."""
        if self.endpoint is not None:
            self.endpoint.close()
        for mirrored in (self._status, self._metrics):
            if mirrored is not None:
                mirrored.remove()

    # ------------------------------------------------------------------ outputs
    def _write_files(self, mono: float) -> None:
        snapshot = self._latest
        if snapshot is None:
            return
        self._written, self._written_mono, self._due_mono = snapshot, mono, None
        if self._status is not None:
            self._status.write(snapshot.to_json() + "\n")  # how it went reaches `_file_written`
        if self._metrics is not None:
            from esiwrap.shell.metrics import render

            self._metrics.write(render(snapshot, snapshot.time, __version__))

    def _file_written(self, path: str, error: OSError | None) -> None:
        """A file was written (here, or by the writer's thread), or could not be: logged once per
        path and error."""
        if error is None:
            self._failed.pop(path, None)
            return
        text = f"{type(error).__name__}: {error.strerror or error}"
        if self._failed.get(path) != text:
            self._failed[path] = text
            self.log.warning(ev.OBSERVE_WRITE_FAILED, path=path, error=text)

    def _page(self, path: str) -> Page | None:
        from esiwrap.shell.endpoint import Page

        if path == "/":
            index = f"esiwrap {__version__}\n/metrics  Prometheus text format\n/status   JSON snapshot\n"
            return Page("text/plain; charset=utf-8", index.encode())
        if path not in ("/metrics", "/status"):
            return None
        snapshot = self._latest
        if snapshot is None:
            return Page("text/plain; charset=utf-8", b"no snapshot yet\n", status=503)
        if path == "/status":
            return Page("application/json", (snapshot.to_json() + "\n").encode())
        from esiwrap.shell.metrics import CONTENT_TYPE, render

        return Page(CONTENT_TYPE, render(snapshot, time.time(), __version__).encode())


def _significant(old: Snapshot, new: Snapshot) -> bool:
    """Changed in something other than the per-step figures."""
    return replace(old, **_VOLATILE) != replace(new, **_VOLATILE)  # type: ignore[arg-type]
