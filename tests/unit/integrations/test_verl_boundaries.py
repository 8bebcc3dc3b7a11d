"""The verl hook's step boundaries on loops shaped like verl's, without verl: a `metric_utils` and a
`ray_trainer` module written here, patched by the hook as the post-import hooks patch verl's.

* verl 0.4.1's `RayPPOTrainer.fit` has no `should_save_ckpt_esi`: its boundary is the
  `compute_throughout_metrics` call every loop makes once a step;
* a subclass defined later anywhere (a recipe) is wrapped at its `class` statement;
* a `fit` that saves but reaches no boundary says so once (`saves: false`, `cannot_save`);
* a `fit` that neither saves nor reaches a boundary (a rollouter) says nothing;
* a `@ray.remote` class in a hooked module is unwrapped, so its own `_save_checkpoint` is reported
  and one request is one save (FullyAsyncTrainer used to save at every later boundary).

The real verl, every version, runs in tests/system/integrations/test_verl_versions.py and
scripts/verl_compat.sh.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recording_transport import RecordingTransport

from esiwrap.integrations import ray_kv
from esiwrap.integrations import verl as hook
from esiwrap.trainer import wire

METRIC_UTILS = """
def compute_throughout_metrics(batch, timing_raw, n_gpus):
    return {"perf/throughput": 1.0}
"""
CHECKPOINT_MANAGER = """
def should_save_ckpt_esi(max_steps_duration, save_ckpt_duration=60, redundant_time=0):
    return False
"""
# A trainer module as verl writes them: names imported from metric_utils by `from ... import`.
RAY_TRAINER = """
import os
from fake_verl_metric_utils import compute_throughout_metrics
{esi_import}

class RayPPOTrainer:
    def __init__(self, config, steps, on_step=None):
        self.config, self.steps, self.on_step, self.global_steps = config, steps, on_step, 0

    def _save_checkpoint(self):
        root = self.config.trainer.default_local_dir
        os.makedirs(os.path.join(root, f"global_step_{{self.global_steps}}"), exist_ok=True)
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as tracker:
            tracker.write(str(self.global_steps))

    def _load_checkpoint(self):
        return None

    def fit(self):
        self._load_checkpoint()
        for step in range(1, self.steps + 1):
            self.global_steps = step
            if self.on_step:
                self.on_step(step)
            {esi_call}
            if self.config.trainer.save_freq > 0 and step % self.config.trainer.save_freq == 0:
                self._save_checkpoint()
            compute_throughout_metrics(batch=None, timing_raw={{}}, n_gpus=1)
"""
VERL_041 = {"esi_import": "", "esi_call": "pass  # verl 0.4.1: no ESI call"}
VERL_091 = {"esi_import": "from fake_verl_checkpoint_manager import should_save_ckpt_esi",
            "esi_call": "should_save_ckpt_esi(max_steps_duration=0)"}


def fake_module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), module.__dict__)
    return module


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingTransport]:
    """A fresh loop whose relay is a recording transport (the TaskRunner's view of Ray's KV)."""
    recording = RecordingTransport()
    monkeypatch.setattr(hook, "loop", hook._Loop())
    monkeypatch.setattr(ray_kv.KvRelay, "from_env", classmethod(lambda cls: recording))
    yield recording
    for name in [n for n in sys.modules if n.startswith("fake_verl_")]:
        del sys.modules[name]


def verl_like(shape: dict[str, str]) -> types.ModuleType:
    """metric_utils patched where it is defined, then the trainer module imported and patched,
    in the order the post-import hooks see them."""
    hook.patch_metrics_module(fake_module("fake_verl_metric_utils", METRIC_UTILS))
    fake_module("fake_verl_checkpoint_manager", CHECKPOINT_MANAGER)
    module = fake_module("fake_verl_ray_trainer", RAY_TRAINER.format(**shape))
    hook.patch_legacy_module(module)
    return module


def config(root: Path, save_freq: int = -1) -> Any:
    return types.SimpleNamespace(trainer=types.SimpleNamespace(
        default_local_dir=str(root), save_freq=save_freq, resume_mode="auto"))


def asked_at(transport: RecordingTransport, at_step: int) -> Any:
    def on_step(step: int) -> None:
        if step == at_step:
            transport.requests = 1  # esiwrap's request arrives during this step

    return on_step


def sent(transport: RecordingTransport, kind: type) -> list[Any]:
    return [m for m in transport.sent if isinstance(m, kind)]


def test_a_loop_shaped_like_verl_041_saves_at_its_metrics_call(transport: RecordingTransport,
                                                               tmp_path: Path) -> None:
    """No should_save_ckpt_esi at all: the loop attaches at `fit`, reports each step at its
    `compute_throughout_metrics` call, and the request made during step 3 is saved at the end of
    step 3 through the trainer's own `_save_checkpoint`, once."""
    module = verl_like(VERL_041)
    module.RayPPOTrainer(config(tmp_path), steps=6, on_step=asked_at(transport, 3)).fit()
    hello = sent(transport, wire.Hello)[0]
    assert (hello.saves, hello.extra["loop"], hello.extra["boundary"]) == (True, "legacy", hook.METRICS)
    assert [m.step for m in sent(transport, wire.SaveEnd)] == [3]
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3"]
    assert [m.step for m in sent(transport, wire.Step)] == [1, 2, 3, 4, 5, 6]  # fit started the clock


def test_verl_saving_the_step_itself_answers_the_request(
        transport: RecordingTransport, tmp_path: Path) -> None:
    """verl's own periodic save of the step (save_freq) comes before the metrics call: it answers
    the request, and the boundary does not save the same step again."""
    module = verl_like(VERL_041)
    module.RayPPOTrainer(config(tmp_path, save_freq=2), steps=4, on_step=asked_at(transport, 2)).fit()
    assert [m.step for m in sent(transport, wire.SaveBegin)] == [2, 4]


def test_where_fit_calls_should_save_ckpt_esi_that_is_the_boundary(transport: RecordingTransport,
                                                                   tmp_path: Path) -> None:
    """A loop that calls both (verl 0.5 on): the ESI call reports the steps, the metrics call
    adds none, and the save comes at the ESI call of the step after the request, as before."""
    module = verl_like(VERL_091)
    module.RayPPOTrainer(config(tmp_path), steps=5, on_step=asked_at(transport, 3)).fit()
    assert sent(transport, wire.Hello)[0].extra["boundary"] == hook.ESI
    assert [m.step for m in sent(transport, wire.Step)] == [1, 2, 3, 4, 5]
    assert [m.step for m in sent(transport, wire.SaveEnd)] == [3]


VERL_GUARDED = {"esi_import": "from fake_verl_checkpoint_manager import should_save_ckpt_esi",
                "esi_call": "if self.config.trainer.get_esi: should_save_ckpt_esi(max_steps_duration=0)"}


def test_an_esi_call_that_never_runs_leaves_the_boundary_to_the_metrics_call(
        transport: RecordingTransport, tmp_path: Path) -> None:
    """A fit whose code names should_save_ckpt_esi behind a guard that stays false: its hello
    expects the ESI call, and after two steps without one the metrics call reports the steps and
    saves; a request is one save, as ever."""
    module = verl_like(VERL_GUARDED)
    settings = config(tmp_path)
    settings.trainer.get_esi = False
    module.RayPPOTrainer(settings, steps=6, on_step=asked_at(transport, 4)).fit()
    assert sent(transport, wire.Hello)[0].extra["boundary"] == hook.ESI
    assert [m.step for m in sent(transport, wire.Step)] == [2, 3, 4, 5, 6]
    assert [m.step for m in sent(transport, wire.SaveEnd)] == [4]


def test_after_a_warm_up_without_esi_calls_the_esi_call_takes_the_boundary_back(
        transport: RecordingTransport, tmp_path: Path) -> None:
    """verl's legacy loop skips the ESI call while the critic warms up: the metrics call reports
    those steps, the first ESI call takes the boundary back, and no step is reported twice."""
    warm_up = "if step > 3: should_save_ckpt_esi(max_steps_duration=0)"
    module = verl_like({**VERL_GUARDED, "esi_call": warm_up})
    module.RayPPOTrainer(config(tmp_path), steps=6, on_step=asked_at(transport, 5)).fit()
    assert [m.step for m in sent(transport, wire.Step)] == [2, 3, 4, 5, 6]
    assert [m.step for m in sent(transport, wire.SaveEnd)] == [5]


def test_a_recipe_subclass_defined_later_is_wrapped_at_its_class_statement(transport: RecordingTransport,
                                                                          tmp_path: Path) -> None:
    """A recipe's trainer (RayDAPOTrainer's shape): a subclass in its own module, with its own
    `fit` that calls no ESI; its own `_save_checkpoint` is reported, a request is one save."""
    module = verl_like(VERL_041)
    metric_utils = sys.modules["fake_verl_metric_utils"]

    class RayRecipeTrainer(module.RayPPOTrainer):  # type: ignore[name-defined,misc]
        def _save_checkpoint(self) -> None:
            super()._save_checkpoint()

        def fit(self) -> None:
            for step in range(1, self.steps + 1):
                self.global_steps = step
                self.on_step(step)
                metric_utils.compute_throughout_metrics(batch=None, timing_raw={}, n_gpus=1)

    assert getattr(RayRecipeTrainer.__dict__["_save_checkpoint"], hook.PATCHED, False)
    RayRecipeTrainer(config(tmp_path), steps=4, on_step=asked_at(transport, 2)).fit()
    assert sent(transport, wire.Hello)[0].extra["trainer"].endswith("RayRecipeTrainer")
    assert [(m.step, m.ok) for m in sent(transport, wire.SaveEnd)] == [(2, True)]
    assert len(sent(transport, wire.SaveBegin)) == 1  # the subclass's super() call is one save


def test_a_fit_that_saves_but_reaches_no_boundary_says_so_once(transport: RecordingTransport,
                                                               tmp_path: Path) -> None:
    """A recipe `fit` calling neither boundary (RayPRIMETrainer's shape) cannot save on request:
    its hello says `saves: false` with the reason and what to do; requests change nothing."""
    module = verl_like(VERL_041)

    class RayPrimeShaped(module.RayPPOTrainer):  # type: ignore[name-defined,misc]
        def fit(self) -> None:
            for step in range(1, self.steps + 1):
                self.global_steps = step
                if step % 100 == 0:
                    self._save_checkpoint()

    transport.requests = 1
    RayPrimeShaped(config(tmp_path), steps=3).fit()
    RayPrimeShaped(config(tmp_path), steps=3).fit()
    hellos = sent(transport, wire.Hello)
    assert len(hellos) == 1 and hellos[0].saves is False
    reason = hellos[0].cannot_save or ""
    assert "RayPrimeShaped.fit" in reason and "trainer.save_freq=N" in reason
    assert not sent(transport, wire.SaveBegin) and not sent(transport, wire.Step)


def test_a_fit_that_neither_saves_nor_steps_says_nothing(
        transport: RecordingTransport, tmp_path: Path) -> None:
    """FullyAsyncRollouter's shape: a RayPPOTrainer subclass whose `fit` only rolls out: no hello
    (it would announce a saver that never saves)."""
    module = verl_like(VERL_041)

    class RolloutOnly(module.RayPPOTrainer):  # type: ignore[name-defined,misc]
        def fit(self) -> None:
            self.generate()

        def generate(self) -> None:
            self.rolled_out = True

    RolloutOnly(config(tmp_path), steps=1).fit()
    assert transport.sent == []


def test_a_ray_remote_class_is_unwrapped_and_one_request_is_one_save(transport: RecordingTransport,
                                                                     tmp_path: Path) -> None:
    """FullyAsyncTrainer's shape: a module name bound to a Ray ActorClass (`__ray_actor_class__`)
    whose class has its own `_save_checkpoint`, saving from `_fit_save_checkpoint` when the ESI
    call says so. Its save is wrapped: after one request, three boundaries, one checkpoint."""
    verl_like(VERL_091)
    source = '''
    import os
    from fake_verl_checkpoint_manager import should_save_ckpt_esi

    class FullyAsyncShaped(BASE):
        def _save_checkpoint(self):
            path = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(os.path.dirname(path), "latest_checkpointed_iteration.txt"), "w") as f:
                f.write(str(self.global_steps))

        def _fit_save_checkpoint(self):
            if should_save_ckpt_esi(max_steps_duration=0):
                self._save_checkpoint()

        def fit(self):
            for step in range(1, 4):
                self.global_steps = step
                self._fit_save_checkpoint()

    class ActorClass:  # what @ray.remote binds the name to
        pass

    ActorClass.__ray_actor_class__ = FullyAsyncShaped
    FullyAsyncTrainer = ActorClass
    del FullyAsyncShaped
    '''
    module = types.ModuleType("fake_verl_fully_async_trainer")
    # not a RayPPOTrainer subclass here: what wraps it is the module's own hook, unwrapping Ray's class
    module.__dict__.update(BASE=type("Base", (), {}))
    sys.modules[module.__name__] = module
    exec(compile(textwrap.dedent(source), "<fully_async>", "exec"), module.__dict__)
    hook.patch_legacy_module(module)
    trainer_cls = module.FullyAsyncTrainer.__ray_actor_class__
    assert getattr(trainer_cls.__dict__["_save_checkpoint"], hook.PATCHED, False)
    transport.requests = 1
    trainer = object.__new__(trainer_cls)
    trainer.config = config(tmp_path)
    trainer.fit()
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_1"]
    assert [m.step for m in sent(transport, wire.SaveEnd)] == [1]


def test_a_trainer_module_that_bound_verls_own_metrics_function_gets_the_patched_one(
        transport: RecordingTransport) -> None:
    """The hook came after the trainer module bound `compute_throughout_metrics`: patching the
    trainer module binds the patched function there too."""
    metric_utils = fake_module("fake_verl_metric_utils", METRIC_UTILS)
    original = metric_utils.compute_throughout_metrics
    fake_module("fake_verl_checkpoint_manager", CHECKPOINT_MANAGER)
    module = fake_module("fake_verl_ray_trainer", RAY_TRAINER.format(**VERL_041))
    assert module.compute_throughout_metrics is original
    hook.patch_metrics_module(metric_utils)
    hook.VERL_METRICS_MODULE, saved = "fake_verl_metric_utils", hook.VERL_METRICS_MODULE
    try:
        hook.patch_legacy_module(module)
    finally:
        hook.VERL_METRICS_MODULE = saved
    assert module.compute_throughout_metrics is metric_utils.compute_throughout_metrics
    assert getattr(module.compute_throughout_metrics, hook.PATCHED, False)


def test_a_load_before_the_loop_attached_is_told_at_attach(
        transport: RecordingTransport, tmp_path: Path) -> None:
    """A subclass loading its checkpoint before anything attached (Separate/OneStepOff load in
    `fit` before their first boundary; a recipe may load in `init_workers`): `start` follows the
    hello."""
    module = verl_like(VERL_041)
    trainer = module.RayPPOTrainer(config(tmp_path), steps=2)
    trainer.global_steps = 7
    trainer._load_checkpoint()  # before fit: nothing attached yet
    assert transport.sent == []
    trainer.fit()
    assert transport.types()[:2] == ["hello", "start"]
    assert sent(transport, wire.Start)[0].step == 7
