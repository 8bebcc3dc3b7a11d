"""Who may speak on the trainer channel, with real processes: forged datagrams from outside
esiwrap's tree, a descendant that speaks for another pid, an attached trainer's end of a save it
never began. Each is refused (`message_refused` names it) and the run ends as it would have
without them: exit 75 with the real checkpoint on disk."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from esiwrap_harness import PLAIN_TRAINER, PYTHON, EsiwrapRun

from esiwrap.core import controller as core
from esiwrap.errors import EXIT_CHECKPOINTED
from esiwrap.shell import channel as shell_channel

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not shell_channel.HAS_CREDENTIALS, reason="SO_PASSCRED is Linux's"),
]

# A process started outside esiwrap's tree (a stale trainer of an earlier run, another job's tool):
# it sends each JSON line it reads on stdin to the socket, at once.
FORGER = textwrap.dedent("""
    import socket, sys
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for line in sys.stdin:
            sender.sendto(line.encode(), sys.argv[1])
            print("sent", flush=True)
""")


def socket_of(pid: int) -> str:
    """The channel's path, as esiwrap exported it to its child."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"ESIWRAP_SOCKET="):
            return item.split(b"=", 1)[1].decode()
    raise AssertionError(f"no ESIWRAP_SOCKET in {pid}'s environment")


def forge(to: str, /, **fields: Any) -> None:
    """A datagram from this test's process: not esiwrap's descendant."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(json.dumps(fields).encode(), to)


def refused(run: EsiwrapRun, message: str, claimed_pid: int, reason: str, pid: int) -> dict[str, Any]:
    return run.wait_event("message_refused", 30, message=message, claimed_pid=claimed_pid, reason=reason,
                          pid=pid)


def test_forgeries_from_outside_esiwraps_tree_change_nothing(esiwrap, tmp_path: Path) -> None:
    """While a real trainer runs: a phantom hello (not to be signalled, saving), a hello that asks
    for the signal, a save_end, a save_snapshot and a bye claiming the trainer's pid, a save_end of
    a process of its own, and a forged acknowledgement right after esiwrap asks for the save that
    ends the run. All refused, each named; the trainer's own save ends the run (exit 75), its
    checkpoint on disk; the forged step 424242 is nowhere."""
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+1h", "--", PYTHON, str(PLAIN_TRAINER), "--ckpt", str(ckpt),
                  "--save-seconds", "3.0")
    trainer = run.child_pid()
    run.wait_event("trainer_attached", 30, pid=trainer)
    path = socket_of(trainer)
    me = os.getpid()
    forge(path, type="hello", pid=me, signal=False, saves=True)
    forge(path, type="hello", pid=me, signal=True, saves=True)
    forge(path, type="save_end", pid=trainer, step=424242, ok=True, path="/nowhere", duration_s=0.2)
    forge(path, type="save_snapshot", pid=trainer, step=424242, duration_s=0.1)
    forge(path, type="bye", pid=trainer)
    forge(path, type="save_end", pid=me, step=424242, ok=True, duration_s=0.2)
    for message in ("hello", "hello", "save_end"):
        refused(run, message, me, core.NOT_IN_TREE, me)
    for message in ("save_end", "save_snapshot", "bye"):
        refused(run, message, trainer, shell_channel.NOT_ITS_PID, me)
    with subprocess.Popen([PYTHON, "-c", FORGER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as forger:
        assert forger.stdin is not None and forger.stdout is not None
        run.signal(signal.SIGTERM)
        run.wait_event("save_requested", 30, reason="sigterm")
        ack = {"type": "save_end", "pid": trainer, "step": 1, "ok": True, "path": str(ckpt),
               "duration_s": 0.02}
        forger.stdin.write(json.dumps(ack) + "\n")
        forger.stdin.flush()
        assert forger.stdout.readline() == "sent\n"
        refused(run, "save_end", trainer, shell_channel.NOT_ITS_PID, forger.pid)
        assert "save_completed" not in run.names()  # the trainer's save takes 3 s
        forger.stdin.close()
    completed = run.wait_event("save_completed", 60)
    assert run.finish(60) == EXIT_CHECKPOINTED
    assert json.loads(ckpt.read_text())["step"] == completed["step"] != 424242
    assert completed["duration_s"] >= 3.0  # the trainer's own save, measured, not a forgery's 0.2 s
    assert run.first("supervisor_exit")["checkpoint_step"] == completed["step"]
    attached = [e["pid"] for e in run.events if e["event"] == "trainer_attached"]
    assert attached == [trainer]  # no phantom trainer to wait for
    assert [e["step"] for e in run.events if e["event"] == "save_completed"] == [completed["step"]]


DESCENDANT = """
import json, os, socket, sys, time
import esiwrap.trainer as esi

ckpt = sys.argv[1]
esi.install()
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:  # speaking for another process
    sender.sendto(json.dumps({"type": "save_end", "pid": os.getppid(), "step": 5, "ok": True,
                              "duration_s": 0.1}).encode(), os.environ["ESIWRAP_SOCKET"])
esi.save_finished(424242, "/nowhere")  # the end of a save this trainer never began
print("forged", flush=True)
step = 0
while True:
    step += 1
    time.sleep(0.2)
    esi.step_done(step)
    if esi.save_requested():
        with esi.saving(step, ckpt):
            with open(ckpt + ".tmp", "w") as out:
                json.dump({"step": step}, out)
            os.replace(ckpt + ".tmp", ckpt)
"""


def test_a_descendant_speaking_for_another_pid_and_an_end_never_begun_are_refused(esiwrap,
                                                                                  tmp_path: Path) -> None:
    """The trainer itself (esiwrap's child) sends a save_end naming esiwrap's pid, then ends a save
    it never began: both refused, naming it and its command line; its real save ends the run."""
    script = tmp_path / "forging_trainer.py"
    script.write_text(DESCENDANT)
    ckpt = tmp_path / "ckpt.json"
    run = esiwrap("--deadline", "+1h", "--", PYTHON, str(script), str(ckpt))
    trainer = run.child_pid()
    run.wait_stdout("forged")
    other = refused(run, "save_end", run.pid, shell_channel.NOT_ITS_PID, trainer)
    assert "forging_trainer.py" in other["cmdline"]
    never = refused(run, "save_end", trainer, core.NEVER_BEGUN, trainer)
    assert "forging_trainer.py" in never["cmdline"]
    run.signal(signal.SIGTERM)
    completed = run.wait_event("save_completed", 60)
    assert run.finish(60) == EXIT_CHECKPOINTED
    assert json.loads(ckpt.read_text())["step"] == completed["step"] not in (5, 424242)
