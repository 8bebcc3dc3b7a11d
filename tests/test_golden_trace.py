"""The decision core's decisions, pinned: a refactor of `esiwrap.controller` changes none of them.

`tests/golden_trace.py` drives the real controller through the simulator's seeded traces and seeded
random input sequences and digests every (input, now, actions) line per section. A deliberate change
of a decision rewrites `tests/golden/controller.sha256` (`PYTHONHASHSEED=0 python
tests/golden_trace.py --update`) in the same commit; anything else that changes a digest is a bug.
"""

from __future__ import annotations

import golden_trace


def test_every_decision_is_the_golden_one() -> None:
    """The controller's actions, in order and with every log field in order, and its snapshot
    match the golden trace in every section (string hashing is not fixed here: no set's order
    may leak into a decision)."""
    found = golden_trace.digests()
    golden = golden_trace.read_digests()
    changed = [name for name in golden if found.get(name) != golden[name]]
    assert found.keys() == golden.keys(), sorted(set(found) ^ set(golden))[:5]
    assert not changed, (f"{len(changed)} of {len(golden)} sections decide differently, first: "
                         f"{changed[:5]}; diff `python tests/golden_trace.py --write` before and after "
                         "(PYTHONHASHSEED=0)")
