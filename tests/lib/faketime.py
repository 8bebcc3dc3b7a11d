"""Step the wall clock of real processes while they run; their monotonic clock keeps going.

    clock = WallClock.create(directory)       # or the `wall_clock` fixture
    run = esiwrap(..., env=clock.env())       # this process and everything it starts
    clock.step(+30)                           # every one of them reads the wall 30 s later

What a machine sees when NTP or an operator steps its clock: `time.time()`, `datetime.now()`
and every other read of CLOCK_REALTIME jump by the step; `time.monotonic()`, `time.perf_counter()`
and every timeout (`time.sleep`, select/poll/epoll, lock and condition waits) keep real time.

How: Debian's libfaketime, preloaded (`LD_PRELOAD`), in its thread-safe build
`libfaketimeMT.so.1` (the plain build's clock state is unguarded, and esiwrap reads the clock from
several threads). Its settings, each one needed:

- `FAKETIME_TIMESTAMP_FILE`: the offset lives in a file (`+30.000000`), replaced atomically by
  `step()`. No `FAKETIME` variable: it would take precedence over the file (and a process that
  has one in its environment ignores this helper).
- `FAKETIME_NO_CACHE=1`: libfaketime reads the file again at every read of the wall clock (by
  default it keeps it 10 s), so a step is seen by every process at its next read, with no delay
  to wait out: `step()` returns once a fresh probe (`date`) has read the new offset. A read costs
  about 5 µs instead of 0.1 µs.
- `FAKETIME_DONT_FAKE_MONOTONIC=1`: CLOCK_MONOTONIC (and _RAW, _COARSE, BOOTTIME) stay real.
- `FAKETIME_FORCE_MONOTONIC_FIX=0`: libfaketime intercepts `pthread_cond_timedwait`; on glibc
  2.30+ its default "monotonic fix" turns a deadline on a CLOCK_MONOTONIC condition (CPython's
  GIL waits on one) into one in the past, so the wait returns at once (upstream PR #503, after
  0.9.12). Without the fix the deadline passes through unchanged; wall-clock conditions are still
  moved by the offset.
- `NO_FAKE_STAT=1`: file timestamps stay the kernel's. libfaketime would shift only those read
  through `stat()` (C programs: Python calls `stat64`, which it does not intercept), and each such
  read would take a semaphore shared by the whole process tree.
- Relative timeouts (nanosleep, poll, select, epoll_wait and their kin) are intercepted but passed
  through unchanged when the offset has no rate (`x2`): the file never holds one.

One path no setting reaches: an absolute `clock_nanosleep` on CLOCK_MONOTONIC, which is how
CPython 3.11 sleeps. Debian 12's libfaketime 0.9.10 treats its deadline as a wall-clock time and
`time.sleep(0.5)` fails with EINVAL (upstream issue #426, fixed in 0.9.11). A shim,
tests/lib/faketime_shim.c, compiled with gcc on first use and preloaded *before* libfaketime, sends
every clock_nanosleep that is not on CLOCK_REALTIME straight to glibc.

Children inherit `LD_PRELOAD` and the variables, so esiwrap's trainer and helpers, and their
children, read the same wall clock; so do processes started before a step.

Not modelled: a wall-clock deadline already being waited on when the step comes (a condition or
`clock_nanosleep` on CLOCK_REALTIME) keeps the offset of its start, where a real step would move
it; absolute `timer_settime`/`timerfd_settime` timers on CLOCK_MONOTONIC are mistranslated by
libfaketime 0.9.10 (CPython 3.11 uses neither); files written after a step carry the real time;
static binaries, setuid programs and runtimes that call the kernel directly (Go) see the real
clock. Each process tree's first process leaves /dev/shm/faketime_shm_PID and
sem.faketime_sem_PID when it does not exit normally (SIGKILL, `os._exit`); `close()` removes
those whose process is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from esiwrap.shell.process import pid_exists

SHIM_SOURCE = Path(__file__).resolve().parent / "faketime_shim.c"
LIBRARY_NAME = "libfaketimeMT.so.1"
LIBRARY_PLACES = ("/usr/lib/*/faketime", "/usr/lib/faketime", "/usr/local/lib/faketime")
SHARED_MEMORY = Path("/dev/shm")
PROBE_SLACK_S = 0.005  # float precision of an epoch reading, and `date`'s parsing
PROBE_TIMEOUT_S = 30.0


class FaketimeUnavailable(RuntimeError):
    """libfaketime or the compiler the shim needs is not installed."""


def find_library() -> Path:
    """Debian's thread-safe libfaketime, or FaketimeUnavailable saying what to install."""
    for place in LIBRARY_PLACES:
        for found in sorted(Path("/").glob(f"{place.lstrip('/')}/{LIBRARY_NAME}")):
            return found
    msg = (f"{LIBRARY_NAME} not found in {', '.join(LIBRARY_PLACES)}: install Debian's libfaketime "
           "(apt-get install libfaketime; scripts/test.sh installs it)")
    raise FaketimeUnavailable(msg)


def build_shim(directory: Path) -> Path:
    """Compile tests/lib/faketime_shim.c into `directory` (once per version of the source)."""
    source = SHIM_SOURCE.read_bytes()
    shim = directory / f"faketime_shim-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if shim.exists():
        return shim
    compiler = shutil.which("gcc")
    if compiler is None:
        msg = "gcc not found: the wall clock's sleep shim is compiled at test time; install gcc and libc6-dev"
        raise FaketimeUnavailable(msg)
    partial = shim.with_name(f".{shim.name}.{os.getpid()}")
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
                           str(partial), str(SHIM_SOURCE), "-ldl"], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        msg = f"gcc could not build {SHIM_SOURCE.name} (libc6-dev installed?): {done.stderr.strip()}"
        raise FaketimeUnavailable(msg)
    os.replace(partial, shim)
    return shim


class WallClock:
    """The wall clock of every process started with `env()`, `offset` seconds from the real one."""

    def __init__(self, directory: Path, shim: Path, library: Path) -> None:
        self.offset_file = directory / "faketime-offset"
        self._shim = shim
        self._library = library
        self._offset_s = 0.0
        self._created = time.time()
        self._write()

    @classmethod
    def create(cls, directory: Path, shim: Path | None = None) -> WallClock:
        """A clock at offset 0 keeping its offset file in `directory`; it builds the shim there
        unless given one. FaketimeUnavailable says what to install; a probe that cannot read the
        clock raises at once, not at the first step."""
        if "FAKETIME" in os.environ:
            msg = "FAKETIME is set in this environment: it would override the offset file; unset it"
            raise FaketimeUnavailable(msg)
        library = find_library()
        clock = cls(directory, shim if shim is not None else build_shim(directory), library)
        clock._confirm()
        return clock

    @property
    def offset(self) -> float:
        """Seconds the wall clock under this helper is ahead of the real one (negative: behind)."""
        return self._offset_s

    def now(self) -> float:
        """The wall clock a process started with `env()` reads now (epoch seconds)."""
        return time.time() + self._offset_s

    def env(self) -> dict[str, str]:
        """Variables to add to a process's environment (merged over os.environ by the caller)."""
        preload = [str(self._shim), str(self._library)]
        if os.environ.get("LD_PRELOAD"):
            preload.append(os.environ["LD_PRELOAD"])
        return {
            "LD_PRELOAD": ":".join(preload),
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_FORCE_MONOTONIC_FIX": "0",
            "NO_FAKE_STAT": "1",
        }

    def step(self, seconds: float) -> None:
        """Move the wall clock by `seconds` for every process under this helper, running or
        started later; returns once a new process reads the new offset."""
        self._offset_s += seconds
        self._write()
        self._confirm()

    def close(self) -> None:
        """Remove the shared memory that process trees under this helper left behind."""
        remove_stale_shared_memory(since=self._created)

    def _write(self) -> None:
        """The offset as libfaketime reads it: seconds, signed, no unit letter (`m`, `h`, `d`,
        `y` anywhere in the line multiply it) and no rate (`x`): `+30.000000`."""
        partial = self.offset_file.with_name(f".{self.offset_file.name}.{os.getpid()}")
        partial.write_text(f"{self._offset_s:+.6f}\n")
        os.replace(partial, self.offset_file)

    def _confirm(self) -> None:
        """A new process (`date`, C, CLOCK_REALTIME) reads the wall clock at `offset`."""
        before = time.time()
        done = subprocess.run(["date", "+%s.%N"], env={**os.environ, **self.env()}, capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
        after = time.time()
        seen = float(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
        expected = (before + self._offset_s - PROBE_SLACK_S, after + self._offset_s + PROBE_SLACK_S)
        if seen is None or not expected[0] <= seen <= expected[1]:
            msg = (f"a probe under the wall clock read {seen} (exit {done.returncode}, "
                   f"{done.stderr.strip()!r}), expected {expected[0]:.3f}..{expected[1]:.3f} "
                   f"(offset {self._offset_s:+.3f} s); env: {self.env()}")
            raise RuntimeError(msg)


def remove_stale_shared_memory(since: float) -> None:
    """Remove libfaketime's shared memory created since `since` (epoch seconds) by a process that
    is gone (one that exited normally removed its own)."""
    for path in SHARED_MEMORY.glob("*faketime_*"):
        found = re.fullmatch(r"(?:sem\.faketime_sem|faketime_shm)_(\d+)", path.name)
        with contextlib.suppress(OSError):
            if found and not pid_exists(int(found[1])) and path.stat().st_mtime >= since - 1:
                path.unlink()


@pytest.fixture(scope="session")
def faketime_shim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sleep shim, compiled once per test worker; at the end, the shared memory left by
    processes that outlived their test's wall clock (killed by a fixture torn down after it)."""
    started = time.time()
    try:
        shim = build_shim(tmp_path_factory.mktemp("faketime-shim"))
    except FaketimeUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield shim
    remove_stale_shared_memory(since=started)


@pytest.fixture
def wall_clock(tmp_path: Path, faketime_shim: Path) -> Iterator[WallClock]:
    """A wall clock at offset 0 for processes started with `wall_clock.env()`; `step(s)` moves it.
    Fails (never skips) when libfaketime is not installed."""
    try:
        clock = WallClock.create(tmp_path, shim=faketime_shim)
    except FaketimeUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield clock
    clock.close()
