"""The zero-code bootstrap: a `sitecustomize` on the child's PYTHONPATH, inert outside esiwrap.

Real interpreters are started with the bootstrap directory on PYTHONPATH; what they import and
set is read back from them. No verl here (see test_verl.py): this is the machinery under it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from esiwrap_harness import EsiwrapRun
from recording_transport import RecordingTransport

from esiwrap.integrations import OUR_RAY_ENV_HOOK
from esiwrap.integrations.importhook import when_imported
from esiwrap.paths import bootstrap_dir
from esiwrap.shell.channel import ChannelServer
from esiwrap.shell.supervisor import SupervisorConfig, child_environment
from esiwrap.trainer import wire

HEAVY = ("verl", "ray", "torch", "psutil", "structlog", "esiwrap.trainer.channel",
         "esiwrap.integrations.ray_relay")
REPORT = (
    "import json, os, sys; print(json.dumps({'modules': sorted(sys.modules), "
    "'hook': os.environ.get('RAY_RUNTIME_ENV_HOOK'), "
    "'chained': os.environ.get('ESIWRAP_CHAINED_RAY_RUNTIME_ENV_HOOK'), "
    "'finders': [type(f).__name__ for f in sys.meta_path]}))"
)


def python(code: str, extra_path: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ESIWRAP_", "RAY_RUNTIME_ENV"))}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_dir(), extra_path) if p)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=60, check=True)


def report(extra_path: str = "", **env: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(python(REPORT, extra_path, **env).stdout)
    return result


@pytest.mark.system
def test_bootstrap_is_inert_without_esiwrap() -> None:
    """Outside esiwrap (no ESIWRAP_SOCKET), the bootstrap imports nothing of ours, installs no
    import hook and sets no Ray hook."""
    seen = report()
    assert not [m for m in seen["modules"] if m.startswith("esiwrap")]  # type: ignore[union-attr]
    assert seen["hook"] is None
    assert "_PostImportFinder" not in seen["finders"]  # type: ignore[operator]


@pytest.mark.system
def test_bootstrap_under_esiwrap_sets_the_ray_hook_and_stays_light() -> None:
    """Under esiwrap, a plain Python process gets the Ray runtime-env hook (a user's hook is kept
    for chaining) and the post-import hook for verl's trainer modules, and imports nothing heavy:
    verl is only patched if and when it is imported."""
    seen = report(ESIWRAP_SOCKET="/nonexistent/esiwrap.sock", RAY_RUNTIME_ENV_HOOK="user.module.hook")
    assert seen["hook"] == OUR_RAY_ENV_HOOK
    assert seen["chained"] == "user.module.hook"
    assert "_PostImportFinder" in seen["finders"]  # type: ignore[operator]
    assert not [m for m in seen["modules"] if m.startswith(HEAVY)]  # type: ignore[union-attr]


@pytest.mark.system
def test_bootstrap_in_a_ray_worker_of_the_job_installs_the_verl_import_hook() -> None:
    """With the job's relay variable (a Ray worker), the post-import hook for verl's trainer modules
    is installed, the save signal is handled (a stray SIGUSR1 cannot kill the worker), and verl
    itself is not imported."""
    code = (
        "import os, signal, sys; os.kill(os.getpid(), signal.SIGUSR1); "
        "from esiwrap.integrations.ray_relay import signal_flag; "
        "print(signal_flag.count, any(type(f).__name__ == '_PostImportFinder' for f in sys.meta_path), "
        "'verl' in sys.modules)"
    )
    out = python(code, ESIWRAP_SOCKET="/nonexistent/esiwrap.sock", ESIWRAP_RELAY="test-relay").stdout
    assert out.split() == ["1", "True", "False"]


@pytest.mark.system
def test_bootstrap_chains_an_existing_sitecustomize(tmp_path: Path) -> None:
    """A sitecustomize that was there before esiwrap still runs, inert or active."""
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    code = "import os; print(os.environ.get('USER_SITECUSTOMIZE_RAN'))"
    assert python(code, str(tmp_path)).stdout.strip() == "1"
    active = python(code, str(tmp_path), ESIWRAP_SOCKET="/nonexistent/esiwrap.sock")
    assert active.stdout.strip() == "1"


@pytest.mark.system
def test_bootstrap_with_a_broken_esiwrap_says_so_and_runs_on(tmp_path: Path) -> None:
    """A Python under esiwrap whose esiwrap fails to import (a broken install, not a missing one)
    still runs the program, with one line on stderr naming the fix; ESIWRAP_HOOK=0 silences it."""
    (tmp_path / "esiwrap").mkdir()
    (tmp_path / "esiwrap" / "__init__.py").write_text("raise ImportError('not in this environment')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
    env.update(PYTHONPATH=os.pathsep.join((bootstrap_dir(), str(tmp_path))), ESIWRAP_SOCKET="/nonexistent")
    done = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == "ran\n"
    assert "integration hook not loaded" in done.stderr and "ESIWRAP_HOOK=0" in done.stderr
    quiet = subprocess.run([sys.executable, "-c", "print('ran')"], env={**env, "ESIWRAP_HOOK": "0"},
                           capture_output=True, text=True, timeout=60, check=True)
    assert (quiet.stdout, quiet.stderr) == ("ran\n", "")


@pytest.fixture(scope="module")
def python_without_esiwrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a fresh venv with nothing installed: another environment's Python."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    absent = subprocess.run([python, "-c", "import esiwrap"], capture_output=True, timeout=60, check=False,
                            cwd=venv, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert absent.returncode != 0
    return python


@pytest.mark.system
def test_a_python_without_esiwrap_stays_silent_unless_it_trains(python_without_esiwrap: str,
                                                                 tmp_path: Path) -> None:
    """Under esiwrap, a Python with no esiwrap installed (a helper, `python3 -m json.tool`) prints
    nothing; one that imports verl's trainer modules gets the missing-hook line, once."""
    trainer = tmp_path / "verl" / "trainer" / "ppo"
    trainer.mkdir(parents=True)
    for package in (tmp_path / "verl", tmp_path / "verl" / "trainer", trainer):
        (package / "__init__.py").write_text("")
    (trainer / "ray_trainer.py").write_text("")
    (trainer / "core_algos.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
    env.update(PYTHONPATH=os.pathsep.join((bootstrap_dir(), str(tmp_path))), ESIWRAP_SOCKET="/nonexistent")

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python_without_esiwrap, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, check=True, cwd=tmp_path)

    helper = run("import json, verl.trainer.ppo.core_algos; print('ran')")
    assert (helper.stdout, helper.stderr) == ("ran\n", "")
    training = run("import verl.trainer.ppo.ray_trainer; import verl.trainer.ppo.ray_trainer; print('ran')")
    assert training.stdout == "ran\n"
    assert training.stderr.count("\n") == 1 and "integration hook not loaded" in training.stderr
    assert "ModuleNotFoundError" in training.stderr and "ESIWRAP_HOOK=0" in training.stderr


@pytest.mark.system
def test_an_unrelated_python_under_esiwrap_prints_nothing(python_without_esiwrap: str) -> None:
    """`esiwrap -- /other/python -c pass`: esiwrap's output has no line from the start-up hook."""
    run = EsiwrapRun(["--sources", "cli", "--", python_without_esiwrap, "-c", "pass"],
                     cwd=Path(python_without_esiwrap).parent)
    try:
        assert run.finish(60) == 0
        assert run.other_lines == [], run.other_lines
    finally:
        run.kill()


@pytest.mark.system
def test_bootstrap_start_up_cost_is_small() -> None:
    """The whole bootstrap (sitecustomize and what it imports) costs well under 30 ms at start-up,
    measured by the interpreter's own -X importtime (best of five on a shared machine)."""
    costs = []
    for _ in range(5):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
        env.update(PYTHONPATH=bootstrap_dir(), ESIWRAP_SOCKET="/nonexistent/esiwrap.sock")
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        line = next(ln for ln in done.stderr.splitlines() if ln.split("|")[-1].strip() == "sitecustomize")
        costs.append(int(line.split("|")[1]) / 1000.0)
    assert min(costs) < 30.0, costs


def test_child_environment_puts_the_bootstrap_first_on_pythonpath() -> None:
    """The child's PYTHONPATH starts with the bootstrap directory and keeps the user's entries."""
    env = child_environment({"PYTHONPATH": "/user/lib"}, "/run/esiwrap.sock", SupervisorConfig(argv=["x"]))
    assert env["PYTHONPATH"].split(os.pathsep) == [bootstrap_dir(), "/user/lib"]
    assert Path(bootstrap_dir(), "sitecustomize.py").is_file()
    modules = sorted(p.name for p in Path(bootstrap_dir()).iterdir() if p.suffix == ".py")
    assert modules == ["sitecustomize.py"]  # nothing else becomes importable in the child
    bare = child_environment({}, "/run/esiwrap.sock", SupervisorConfig(argv=["x"]))
    assert bare["PYTHONPATH"] == bootstrap_dir()


@pytest.mark.system
def test_runtime_env_hook_makes_the_driver_the_relay_and_ships_the_hook() -> None:
    """In a Ray driver's `ray.init`, the hook says hello (signal handled, stop with SIGINT, no saves
    of its own yet) and extends the job's runtime env: our package in py_modules, our worker setup
    hook chained before the user's, the relay id and the save signal for the workers."""
    server = ChannelServer()
    try:
        code = (
            "import json; from esiwrap.integrations.ray_relay import runtime_env_hook; "
            "env = runtime_env_hook({'env_vars': {'A': '1'}, 'py_modules': ['/user/mod'], "
            "'worker_process_setup_hook': 'user.setup'}); print(json.dumps(env))"
        )
        env = json.loads(python(code, ESIWRAP_SOCKET=server.path).stdout)
        datagram = server.receive()[0]
    finally:
        server.close()
    package = str(Path(bootstrap_dir()).parent)
    assert env["py_modules"] == ["/user/mod", package]
    assert env["worker_process_setup_hook"] == "esiwrap.integrations.ray_relay.worker_setup"
    assert env["env_vars"]["ESIWRAP_CHAINED_SETUP_HOOK"] == "user.setup"
    assert env["env_vars"]["A"] == "1" and env["env_vars"]["ESIWRAP_SIGNAL"] == "SIGUSR1"
    assert isinstance(datagram.decoded, wire.Envelope)
    hello = datagram.decoded.message
    assert env["env_vars"]["ESIWRAP_RELAY"].startswith(f"{datagram.sender}-")
    assert datagram.decoded.pid == datagram.sender  # the relay speaks as itself
    assert isinstance(hello, wire.Hello)
    assert (hello.signal, hello.stop_signal, hello.saves, hello.relay) == (True, "SIGINT", False, True)


@pytest.mark.system
def test_worker_setup_hook_handles_the_signal_then_runs_the_users_hook(tmp_path: Path) -> None:
    """The job's `worker_process_setup_hook` (what reaches workers of a separately started
    cluster): the save signal is handled so it cannot kill the worker, the verl import hook is in
    place, and the user's own setup hook still runs, after ours."""
    (tmp_path / "user_setup.py").write_text("def hook():\n    print('user hook ran')\n")
    code = (
        "import os, signal, sys; sys.path.insert(0, os.environ['USER_DIR']); "
        "from esiwrap.integrations.ray_relay import worker_setup, signal_flag; worker_setup(); "
        "os.kill(os.getpid(), signal.SIGUSR1); "
        "print(signal_flag.count, any(type(f).__name__ == '_PostImportFinder' for f in sys.meta_path))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
    env.update(USER_DIR=str(tmp_path), ESIWRAP_CHAINED_SETUP_HOOK="user_setup.hook", PYTHONPATH="")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split("\n")[:2] == ["user hook ran", "1 True"]


def test_import_hook_runs_after_the_module_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The callback sees the fully executed module, and the module is not imported by watching it."""
    (tmp_path / "esiwrap_probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    when_imported("esiwrap_probe_module", lambda module: seen.append(module.VALUE))
    assert "esiwrap_probe_module" not in sys.modules and seen == []
    import esiwrap_probe_module  # noqa: F401

    assert seen == [42]
    when_imported("esiwrap_probe_module", lambda module: seen.append(-module.VALUE))
    assert seen == [42, -42]  # already imported: at once
    del sys.modules["esiwrap_probe_module"]


def test_a_failing_import_hook_never_breaks_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug in a hook is reported on stderr; the user's import still succeeds."""
    (tmp_path / "esiwrap_probe_broken.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module: object) -> None:
        raise RuntimeError("boom")

    when_imported("esiwrap_probe_broken", broken)
    import esiwrap_probe_broken

    assert esiwrap_probe_broken.VALUE == 1
    assert "hook for esiwrap_probe_broken failed" in capsys.readouterr().err
    del sys.modules["esiwrap_probe_broken"]


def trainer_at(step: int, root: Path, finalize: object = None) -> object:
    from types import SimpleNamespace

    config = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(root), save_freq=-1))
    return SimpleNamespace(config=config, global_steps=step,
                           actor_rollout_wg=SimpleNamespace(async_calls_finalize_fn_exec=finalize))


def test_verl_save_is_acknowledged_only_once_the_tracker_names_its_step(tmp_path: Path) -> None:
    """An async save nobody asked for is reported when a later boundary finds verl's tracker file
    naming its step; until then there is no save_end (the checkpoint is not resumable yet)."""
    from esiwrap.integrations.verl import _Loop

    loop, transport = _Loop(), RecordingTransport()
    loop.transport = transport
    loop.saved(trainer_at(5, tmp_path), lambda trainer: None, (), {})
    loop.boundary(6)  # the first boundary only starts the clock
    assert transport.types() == ["save_begin"]
    loop.boundary(7)
    assert transport.types() == ["save_begin", "step"]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    loop.boundary(8)
    assert transport.types() == ["save_begin", "step", "step", "save_end"]
    end = transport.sent[-1]
    assert isinstance(end, wire.SaveEnd)
    assert (end.ok, end.step, end.path) == (True, 5, str(tmp_path / "global_step_5"))


def test_verl_requested_async_save_is_finalized_before_the_acknowledgement(tmp_path: Path) -> None:
    """A save esiwrap asked for is finalized at once (the instance may be gone soon), then
    acknowledged, and the request counts as handled."""
    from esiwrap.integrations.verl import _Loop

    def finalize(blocking: bool) -> None:
        assert blocking
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("9")

    loop, transport = _Loop(), RecordingTransport(requests=1)
    loop.transport = transport
    assert loop.save_requested()
    loop.saved(trainer_at(9, tmp_path, finalize), lambda trainer: None, (), {})
    assert transport.types() == ["save_begin", "save_end"] and transport.sent[-1] == wire.SaveEnd(
        9, ok=True, path=str(tmp_path / "global_step_9"), duration_s=transport.sent[-1].duration_s)  # type: ignore[union-attr]
    assert not loop.save_requested()


def test_verl_failed_save_is_reported_and_the_request_stays(tmp_path: Path) -> None:
    """A save that raises is reported as failed and re-raised; the request is still pending, so
    the next boundary tries again."""
    from esiwrap.integrations.verl import _Loop

    def broken(trainer: object) -> None:
        raise OSError("disk full")

    loop, transport = _Loop(), RecordingTransport(requests=1)
    loop.transport = transport
    with pytest.raises(OSError):
        loop.saved(trainer_at(3, tmp_path), broken, (), {})
    end = transport.sent[-1]
    assert transport.types() == ["save_begin", "save_end"]
    assert isinstance(end, wire.SaveEnd) and end.ok is False
    assert loop.save_requested()


def test_verl_direct_async_save_satisfies_the_signal_before_its_acknowledgement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the relay (esiwrap signals the TaskRunner itself) an async save that is not
    finalized at once satisfies the signal that asked for it: the next boundary does not save
    again while the save is still in flight, and its acknowledgement comes once the tracker
    names its step."""
    import signal as signals

    from esiwrap.integrations import ray_relay
    from esiwrap.integrations.verl import _DirectChannel, _Loop

    monkeypatch.delenv("ESIWRAP_SOCKET", raising=False)
    previous = signals.getsignal(signals.SIGUSR1)
    try:
        assert ray_relay.install_signal_flag()
        loop = _Loop()
        loop.transport = _DirectChannel()
        os.kill(os.getpid(), signals.SIGUSR1)  # esiwrap's save signal, counted by the handler
        assert loop.save_requested()
        loop.saved(trainer_at(4, tmp_path, lambda blocking: None), lambda trainer: None, (), {})
        assert loop.pending  # finalize wrote nothing yet: no acknowledgement
        loop.boundary(5)
        assert not loop.save_requested()  # the save in flight is the answer to that signal
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
        loop.boundary(6)
        assert not loop.pending and not loop.save_requested()
    finally:
        signals.signal(signals.SIGUSR1, previous)


ENDS_AFTER_HELLO = """
import atexit, signal, sys
atexit.register(lambda: print("atexit:", "SIG_IGN" if signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
                              else "a handler", flush=True))  # registered first: runs last
if sys.argv[1] == "ray-driver":
    from esiwrap.integrations.ray_relay import runtime_env_hook
    runtime_env_hook({})  # what ray.init calls in the driver: the relay says hello
else:
    from esiwrap.integrations import verl
    assert verl.loop.attach("legacy", None)  # a TaskRunner without the relay: hello, signalled directly
print("said hello", flush=True)
"""


@pytest.mark.system
@pytest.mark.parametrize("who", ["ray-driver", "taskrunner"])
def test_the_hooks_processes_ignore_the_save_signal_at_exit_then_say_bye(who: str) -> None:
    """The Ray driver's relay and a TaskRunner that attached directly install their own save-signal
    handler (not `esiwrap.trainer.install()`'s); at their end they get the same treatment: the
    save signal ignored from the atexit hook on (a signal during the interpreter's shutdown would
    kill a finished run), then `bye`, once."""
    server = ChannelServer()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESIWRAP_")}
    try:
        done = subprocess.run([sys.executable, "-c", ENDS_AFTER_HELLO, who], capture_output=True, text=True,
                              timeout=60, env={**env, "ESIWRAP_SOCKET": server.path})
        got = [datagram.decoded for datagram in server.receive()]
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "said hello\natexit: SIG_IGN\n", (done.stdout, done.stderr)
    kinds = [wire.type_of(envelope.message) for envelope in got if isinstance(envelope, wire.Envelope)]
    assert kinds == ["hello", "bye"], kinds
