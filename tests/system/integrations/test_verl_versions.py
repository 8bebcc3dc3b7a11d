"""The zero-code check (tests/lib/verl_zero_code.py) on the installed verl (0.9 in CI), through every
loop this verl has: `main_ppo`'s legacy loop (`trainer.use_v1=false`), its V1 loop (the default
of 0.9), 0.8.0's `main_ppo_sync`, a recipe-style subclass of `RayPPOTrainer` defined in the
driver, and a subclass whose `fit` reaches no step boundary (a loud no: one warning and a 76 that
says why). scripts/verl_compat.sh runs the same check on each verl from 0.4.1 on, each in a venv
of its own; its table is in docs/running/verl.md."""

from __future__ import annotations

import importlib.util
import json

import pytest

# Never skipped: scripts/test.sh installs verl, and a broken install must fail loudly.
import verl
from verl_zero_code import run

pytestmark = [pytest.mark.system, pytest.mark.timeout(420)]

HAS = {
    "legacy": True,
    "v1": importlib.util.find_spec("verl.trainer.ppo.v1") is not None,  # 0.9 on
    "sync": importlib.util.find_spec("verl.trainer.main_ppo_sync") is not None,  # 0.8.0 only
    "recipe": True,
    "nosave": True,
}


@pytest.mark.parametrize("loop", [loop for loop, present in HAS.items() if present])
def test_the_zero_code_check_passes_through_each_loop_of_this_verl(loop: str) -> None:
    """Exit 75 after exactly one save esiwrap asked for, through verl's own `_save_checkpoint`,
    the tracker naming its step; for the loop with no boundary, one `trainer_cannot_save` and a
    76 whose reason is that warning. Each loop this verl has (0.8.0's `main_ppo_sync` is in no
    other release: scripts/verl_compat.sh runs it on 0.8.0)."""
    result = run(loop, timeout=360)
    assert result["verdict"] == "PASS", json.dumps(result, indent=1)
    assert result["verl"] == verl.__version__
    if loop == "nosave":
        assert "RayPrimeShapedTrainer.fit reaches no step boundary" in result["cannot_save"][0]
    else:
        boundary = {"v1": "on_step_end", "sync": "compute_throughout_metrics",
                    "recipe": "compute_throughout_metrics"}.get(loop)
        expected = boundary or ("should_save_ckpt_esi" if hasattr_esi() else "compute_throughout_metrics")
        assert result["hello"][0]["boundary"] == expected, result["hello"]


def hasattr_esi() -> bool:
    from verl.utils.checkpoint import checkpoint_manager

    return hasattr(checkpoint_manager, "should_save_ckpt_esi")  # verl 0.5.0 on


def test_the_compatibility_script_parses_and_says_how_to_run_it() -> None:
    """scripts/verl_compat.sh: valid bash, `--help` names the reuse flag, an unknown option is a
    usage error (exit 2) before any venv is built."""
    import subprocess

    from esiwrap_harness import ROOT

    script = str(ROOT / "scripts" / "verl_compat.sh")
    subprocess.run(["bash", "-n", script], check=True, timeout=30)
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "--reuse" in shown.stdout
    wrong = subprocess.run(["bash", script, "--no-such-flag"], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and "--no-such-flag" in wrong.stderr
