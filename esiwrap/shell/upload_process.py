"""The `--upload` helper: the user's command for one checkpoint, as esiwrap's own child process; the
`--verify`, `--restore` and `--restore-manifests` commands run the same way.

The command runs through `/bin/sh -c`, with `{path}` and `{step}` replaced (the path shell-quoted,
so a path with spaces or quotes is one word; `{manifest}` and `{dir}` likewise) and
`ESIWRAP_CHECKPOINT_PATH` / `ESIWRAP_CHECKPOINT_STEP` (`ESIWRAP_MANIFEST`, `ESIWRAP_MANIFEST_DIR`)
in its environment. It runs in a session and process group of its own
(a cut-off reaches everything it started), with no input; its standard output goes to esiwrap's
stderr, and its stderr through a pipe that the supervisor's loop reads: each line is passed on to
esiwrap's stderr whole, in order with esiwrap's own log lines (`esiwrap.shell.log.passthrough`), and
the last ones are kept for `upload_failed`. The supervisor reaps it
like any child (waitpid in the loop). Nothing here decides: the controller says when to start one
and when to cut it off.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Mapping

from esiwrap.envvars import CHECKPOINT_PATH_ENV, CHECKPOINT_STEP_ENV, MANIFEST_DIR_ENV, MANIFEST_ENV
from esiwrap.shell import log

SHELL = "/bin/sh"
TAIL_LINES = 20  # the last lines of stderr kept for upload_failed
MAX_LINE = 4096  # a longer line without a newline is passed on in pieces
_PLACEHOLDER = re.compile(r"\{(path|step|manifest|dir)\}")


def render(template: str, path: str, step: int, *, manifest: str = "", directory: str = "") -> str:
    """The command line for this checkpoint: `{path}` shell-quoted, `{step}` the number; `{manifest}`
    and `{dir}` shell-quoted."""
    values = {"path": shlex.quote(path), "step": str(step), "manifest": shlex.quote(manifest),
              "dir": shlex.quote(directory)}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def needs_path(template: str) -> bool:
    return "{path}" in template


class UploadProcess:
    """One running upload: its pid (also its process group) and its stderr pipe."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.pid = proc.pid
        self._proc = proc
        assert proc.stderr is not None
        self.stderr_fd: int | None = proc.stderr.fileno()
        os.set_blocking(self.stderr_fd, False)
        self._partial = b""
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    @classmethod
    def start(cls, template: str, path: str, step: int, environ: Mapping[str, str],
              out_fd: int = 2, *, manifest: str = "", directory: str = "") -> UploadProcess:
        """Start the command; OSError when it cannot be (no /bin/sh, no processes left)."""
        env = {**environ, CHECKPOINT_PATH_ENV: path, CHECKPOINT_STEP_ENV: str(step)}
        if manifest:
            env[MANIFEST_ENV] = manifest
        if directory:
            env[MANIFEST_DIR_ENV] = directory
        command = render(template, path, step, manifest=manifest, directory=directory)
        proc = subprocess.Popen(
            [SHELL, "-c", command], stdin=subprocess.DEVNULL, stdout=out_fd,
            stderr=subprocess.PIPE, env=env, start_new_session=True, close_fds=True,
        )
        proc.returncode = 0  # esiwrap reaps with waitpid(-1); keep Popen from reaping or warning
        return cls(proc)

    def read_stderr(self) -> bool:
        """Pass on what the pipe holds now; False once it is closed (end of file)."""
        if self.stderr_fd is None:
            return False
        while True:
            try:
                data = os.read(self.stderr_fd, 65536)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                data = b""
            if not data:
                self._flush(final=True)
                self.close()
                return False
            self._partial += data
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        *lines, self._partial = self._partial.split(b"\n")
        if final and self._partial:
            lines, self._partial = [*lines, self._partial], b""
        while len(self._partial) > MAX_LINE:
            lines.append(self._partial[:MAX_LINE])
            self._partial = self._partial[MAX_LINE:]
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            log.passthrough(text)  # in order with esiwrap's own lines, never blocking the loop
            text = text.rstrip("\r")
            if text.strip():
                self.tail.append(text[-500:])

    def signal(self, signum: int) -> None:
        """Signal its process group (everything the command started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def close(self) -> None:
        if self.stderr_fd is not None and self._proc.stderr is not None:
            with contextlib.suppress(OSError):
                self._proc.stderr.close()
        self.stderr_fd = None
