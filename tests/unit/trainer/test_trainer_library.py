"""esiwrap.trainer in-process: handlers, flags and the messages it sends on a real socket."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import FINISHING_TRAINER, release, send_until_gone, wait_until

import esiwrap.trainer as esi
from esiwrap.shell.channel import ChannelServer
from esiwrap.trainer import wire
from esiwrap.trainer.channel import SIGNAL_ENV, SOCKET_ENV, ChannelClient


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChannelServer]:
    """A real supervisor-side socket, exported the way esiwrap exports it."""
    srv = ChannelServer()
    monkeypatch.setenv(SOCKET_ENV, srv.path)
    monkeypatch.delenv(SIGNAL_ENV, raising=False)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    yield srv
    esi.uninstall()  # under "esiwrap" this leaves the signal ignored: no later test inherits it
    esi.clear()
    for signum, handler in before.items():
        signal.signal(signum, handler)
    srv.close()


def messages(srv: ChannelServer) -> list[wire.Envelope]:
    """What the socket received, each from this process (the kernel's word) and well formed."""
    got = srv.receive()
    assert all(isinstance(d.decoded, wire.Envelope) for d in got), got
    return [d.decoded for d in got if isinstance(d.decoded, wire.Envelope)]


def test_install_says_hello_and_the_handler_only_sets_the_flag(server: ChannelServer) -> None:
    """A real SIGUSR1 sets the flag; the hello carries pid, rank and the integration."""
    esi.install()
    hello = messages(server)[0]
    assert isinstance(hello.message, wire.Hello) and hello.pid == os.getpid()
    assert hello.message.rank == 0 and hello.message.saves is True
    assert not esi.save_requested()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert esi.save_requested()
    esi.clear()
    assert not esi.save_requested()


def test_previous_handler_is_chained_and_restored(server: ChannelServer) -> None:
    """install() chains the handler that was there; uninstall() puts it back."""
    seen: list[int] = []

    def previous(signum: int, _frame: object) -> None:
        seen.append(signum)

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        esi.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert esi.save_requested() and seen == [signal.SIGUSR1]
        esi.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is previous
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_signal_comes_from_esiwrap_env(server: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--signal SIGUSR2` is exported as ESIWRAP_SIGNAL; install() listens to it."""
    monkeypatch.setenv(SIGNAL_ENV, "SIGUSR2")
    esi.install()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert esi.save_requested()


def test_works_without_esiwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ESIWRAP_SOCKET: install() still works, so `kill -USR1` asks for a save by hand."""
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    esi.install()
    try:
        esi.step_done(1)  # nowhere to send: silently nothing
        os.kill(os.getpid(), signal.SIGUSR1)
        assert esi.save_requested()
        with esi.saving(1, "/tmp/x"):
            pass
        assert not esi.save_requested()
    finally:
        esi.uninstall()


def test_install_off_the_main_thread_is_refused(server: ChannelServer) -> None:
    """Signal handlers belong to the main thread; say so instead of failing obscurely."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            esi.install()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


def test_step_and_save_messages(server: ChannelServer) -> None:
    """step_done and saving() report boundaries, begin/end, duration and path; success clears."""
    esi.install()
    esi.step_done(7)
    esi.request_save()
    with esi.saving(7, "/ckpt/step7"):
        pass
    got = [m.message for m in messages(server)]
    kinds = [wire.type_of(m) for m in got]
    assert kinds == ["hello", "step", "save_begin", "save_end"]
    step, begin, end = got[1], got[2], got[3]
    assert isinstance(step, wire.Step) and step.step == 7 and step.duration_s >= 0
    assert isinstance(begin, wire.SaveBegin) and begin.step == 7
    assert isinstance(end, wire.SaveEnd) and end.ok is True and end.path == "/ckpt/step7"
    assert not esi.save_requested()


def test_failed_save_is_reported_and_keeps_the_request(server: ChannelServer) -> None:
    """An exception inside saving() is a failed save; the request stays for the next boundary."""
    esi.install()
    esi.request_save()
    with pytest.raises(OSError), esi.saving(3):
        raise OSError("disk full")
    end = messages(server)[-1].message
    assert isinstance(end, wire.SaveEnd) and end.ok is False
    assert end.error is not None and "disk full" in end.error
    assert esi.save_requested()


def test_sending_never_raises_or_blocks_without_a_receiver(tmp_path) -> None:
    """A vanished supervisor (socket gone) costs the trainer nothing but a False."""
    client = ChannelClient(str(tmp_path / "gone.sock"))
    assert client.send(wire.Step(step=1)) is False
    assert client.send(wire.Hello(extra={"model": object()})) is False  # not JSON: dropped, not raised
    assert client.send(wire.Step(step="1")) is False  # type: ignore[arg-type]  # refused, not raised
    assert ChannelClient(None).send(wire.Step(step=1)) is False


def test_hello_from_another_rank(server: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK/WORLD_SIZE from torchrun are in the hello; saves=False marks a non-saving rank."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    esi.install(saves=False, stop_signal="SIGINT")
    hello = messages(server)[0].message
    assert isinstance(hello, wire.Hello) and hello.rank == 1 and hello.world_size == 2
    assert hello.saves is False and hello.stop_signal == "SIGINT"


def test_signal_names_are_read_one_way_everywhere() -> None:
    """ESIWRAP_SIGNAL and a hello's stop_signal accept SIGINT, int and 2; nonsense is refused."""
    from esiwrap.signals import save_signal, signal_number

    assert signal_number("SIGINT") == signal_number("int") == signal_number(" 2 ") == signal.SIGINT
    assert signal_number("SIGNOPE") is None and signal_number("999") is None
    assert save_signal({SIGNAL_ENV: "usr2"}) == signal.SIGUSR2
    assert save_signal({SIGNAL_ENV: "bogus"}) == save_signal({}) == signal.SIGUSR1


def test_save_requested_and_answers_both_questions(server: ChannelServer) -> None:
    """One call answers "save?" and "any rank raised my flag?"; with one process, the flags."""
    esi.install()
    assert esi.save_requested_and(True) == (False, True)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert esi.save_requested_and(False) == (True, False)
    assert esi.save_requested() and esi.any_rank(True) and not esi.any_rank(False)


TWO_RANKS = """
import os, sys
import torch
import torch.distributed as dist
import esiwrap.trainer as esi

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2)
esi.install(saves=rank == 0)
if rank == 1:
    esi.request_save()  # this rank's node asked; rank 0's did not
assert esi.save_requested()  # the same answer on both ranks
try:
    with esi.saving(5, "/ckpt/5"):
        if rank == 0:
            raise OSError("disk full")
except OSError:
    pass
dist.destroy_process_group()
"""


@pytest.mark.system
def test_ranks_agree_on_a_saves_end_and_mark_a_peer_nodes_request(server: ChannelServer) -> None:
    """Two gloo ranks: rank 1 was asked, rank 0 was not (its node's esiwrap did not ask): rank 0's
    messages say `peer: true`. Rank 0's write fails: the end of `saving()` waits for both and both
    report the save failed, so no node acknowledges a checkpoint that is not complete."""
    import subprocess
    import sys

    from esiwrap_harness import free_port

    port = str(free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(rank), port], env=env) for rank in (0, 1)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    by_pid = {rank.pid: r for r, rank in enumerate(ranks)}
    sent = [(by_pid[m.pid], m.message) for m in messages(server)]
    begins = {r: m for r, m in sent if isinstance(m, wire.SaveBegin)}
    ends = {r: m for r, m in sent if isinstance(m, wire.SaveEnd)}
    assert begins[0].peer is True and begins[1].peer is False
    assert ends[0].ok is False and (ends[0].error or "").startswith("OSError('disk full')")
    assert ends[1].ok is False and ends[1].error == "the save failed on another rank"


# ------------------------------------------------------------------------ the end of the process
def test_at_exit_the_save_signal_is_ignored_before_the_bye_goes(server: ChannelServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook `install()` registers with atexit (called here by hand): from then on the save
    signal is ignored, already when the bye is sent (a signal esiwrap sent before it read the bye
    finds it ignored), a later `uninstall()` does not give it back, and the bye goes once."""
    esi.install()
    at_send: list[tuple[str, Any]] = []
    send = ChannelClient.send

    def recording_send(client: ChannelClient, message: wire.Message) -> bool:
        at_send.append((wire.type_of(message), signal.getsignal(signal.SIGUSR1)))
        return send(client, message)

    monkeypatch.setattr(ChannelClient, "send", recording_send)
    try:
        esi._say_bye()
        os.kill(os.getpid(), signal.SIGUSR1)  # ignored: no flag (and no death)
        assert not esi.save_requested()
        esi.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert at_send == [("bye", signal.SIG_IGN)]
        assert [(wire.type_of(m.message), m.pid) for m in messages(server)] == [
            ("hello", os.getpid()), ("bye", os.getpid())]
        esi._say_bye()
        assert messages(server) == []
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_uninstall_says_bye_and_the_save_signal_cannot_kill_until_install_says_hello_again(
        server: ChannelServer) -> None:
    """`uninstall()` under esiwrap: the bye goes, the save signal is ignored (its earlier action,
    the default, would kill: a signal esiwrap sent before it read the bye must not), and
    `install()` again says hello, stamped after the bye."""
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # a trainer's start (a test before may have left a handler)
    try:
        esi.install()
        esi.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)  # ignored: this test lives on
        assert not esi.save_requested()
        esi.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert esi.save_requested()
        got = messages(server)
        assert [wire.type_of(m.message) for m in got] == ["hello", "bye", "hello"]
        stamps = [m.sent_mono for m in got]
        assert None not in stamps and stamps == sorted(stamps) and len(set(stamps)) == 3
        esi._say_bye()
        assert [wire.type_of(m.message) for m in messages(server)] == ["bye"]  # the process's end
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_uninstall_without_esiwrap_gives_the_default_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """No esiwrap (no socket): nothing to say bye to, and `uninstall()` restores what was there."""
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # what a trainer starts with
    try:
        esi.install()
        esi.uninstall()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, before)


class Finishing:
    """`children/finishing_trainer.py` started without esiwrap, read line by line with bounded waits."""

    def __init__(self, tmp_path: Path, run: int, *args: str) -> None:
        self.fifo = tmp_path / f"hold-{run}"
        os.mkfifo(self.fifo)
        argv = [sys.executable, str(FINISHING_TRAINER), "--hold", str(self.fifo), *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.pidfd = os.pidfd_open(self.proc.pid)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.out = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_line(self, line: str, timeout: float = 30.0) -> None:
        def read() -> bool:
            assert self.proc.stdout is not None
            with contextlib.suppress(BlockingIOError):
                self.out += os.read(self.proc.stdout.fileno(), 4096)
            return f"{line}\n".encode() in self.out or not self.alive()

        assert wait_until(read, timeout, interval=0.005), f"no {line!r} within {timeout}s: {self.out!r}"
        assert f"{line}\n".encode() in self.out, f"ended before {line!r}: {self.out!r}"

    def end(self) -> int:
        """Its exit status once gone (-N: killed by signal N)."""
        code = self.proc.wait(timeout=30)
        os.close(self.pidfd)
        return code

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()


def finish_under_fire(tmp_path: Path, run: int, *args: str, holds_at: str = "teardown") -> tuple[int, bytes]:
    """Start the finishing trainer; where it holds on its way out (by default once the interpreter
    has given the signal handlers back), send it SIGUSR1 200 times, let it go on and keep sending
    it SIGUSR1 in a tight loop until it is gone. Its exit status, and what it wrote."""
    child = Finishing(tmp_path, run, *args)
    try:
        child.wait_line(holds_at)
        send_until_gone(child.pidfd, signal.SIGUSR1, child.alive, at_most=200)
        release(child.fifo, child.alive)
        send_until_gone(child.pidfd, signal.SIGUSR1, child.alive)
        return child.end(), child.out
    finally:
        child.kill()


@pytest.mark.system
@pytest.mark.parametrize(("end", "code", "holds_at", "runs"), [
    ("return", 0, "teardown", 20), ("exit", 3, "teardown", 5), ("raise", 1, "teardown", 5),
    ("os_exit", 4, "os._exit", 5),
])
def test_a_finished_trainer_ends_with_its_own_code_while_save_signals_rain_on_it(
        server: ChannelServer, tmp_path: Path, end: str, code: int, holds_at: str, runs: int) -> None:
    """A trainer that ends (the script's end, sys.exit, an uncaught exception, os._exit) while
    save signals keep coming exits with its own code every time, never 128+SIGUSR1: from the
    library's atexit hook on the signal is ignored, also after the interpreter gave its Python
    handlers back to the default action (where it holds here while 200 signals come). It said
    bye before that; with os._exit there is no atexit hook and no bye, and the handler it had
    stays until the process is gone."""
    for run in range(runs):
        status, out = finish_under_fire(tmp_path, run, "--end", end, holds_at=holds_at)
        assert status == code, f"run {run}: exit status {status}; {out!r}"
        said = [wire.type_of(m.message) for m in messages(server)
                if wire.type_of(m.message) in ("hello", "bye")]  # (this run's)
        if end == "os_exit":
            assert said == ["hello"], said
        else:
            assert b"atexit: SIG_IGN\n" in out and said == ["hello", "bye"], (out, said)


@pytest.mark.system
def test_without_the_librarys_hook_a_signal_in_the_shutdown_kills(tmp_path: Path) -> None:
    """The control of the test above: a trainer with a Python handler of its own (what install()
    set, without its exit hook) dies of the save signal that reaches it while it holds in the
    interpreter's shutdown: the holds land where a handler no longer protects the process."""
    for run in range(3):
        status, out = finish_under_fire(tmp_path, run, "--own-handler")
        assert b"atexit: a handler\n" in out, out
        assert status == -signal.SIGUSR1, f"run {run}: exit status {status}"


FORKS = """
import os, sys
import esiwrap.trainer as esi
esi.install()
child = os.fork()
if child == 0:
    sys.exit(0)  # the child runs the atexit hooks it inherited: it never said hello, it says no bye
_, status = os.waitpid(child, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.system
def test_only_the_process_that_said_hello_says_bye(server: ChannelServer) -> None:
    """A forked child inherits the atexit hook, not the hello: it ends without a bye, and only the
    process that installed says one."""
    done = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "child 0\n", done.stderr
    got = [(wire.type_of(m.message), m.pid) for m in messages(server)
           if wire.type_of(m.message) in ("hello", "bye")]
    assert [kind for kind, _ in got] == ["hello", "bye"] and got[0][1] == got[1][1]
