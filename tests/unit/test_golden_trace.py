"""The decision core's decisions, pinned: a refactor changes none of them.

`tests/lib/golden_trace.py` drives the real controller in production's order through the simulator's
seeded traces and seeded random input sequences, and writes every call's decisions and log lines
apart. A deliberate change of a decision rewrites `tests/lib/golden/` (`PYTHONHASHSEED=0 python
tests/lib/golden_trace.py --update`) in the same commit; anything else that changes a line is a bug.
"""

from __future__ import annotations

import golden_trace


def test_every_decision_and_log_line_is_the_golden_one() -> None:
    """Every section's calls, their actions in order and their log lines with every field in order,
    and the snapshots match the golden copies (string hashing is not fixed here: no set's order may
    leak into a decision). A failure names the first differing call of each changed section."""
    golden = {kind: golden_trace.read_golden(kind) for kind in golden_trace.KINDS}
    found = golden_trace.differences(golden, golden_trace.render(golden_trace.traced()))
    shown = "\n".join(str(d) for d in found[:5])
    assert not found, (f"{len(found)} section(s) differ; the first:\n{shown}\n"
                       "(PYTHONHASHSEED=0 python tests/lib/golden_trace.py --diff shows them all)")


def test_a_difference_names_its_first_call() -> None:
    """The comparison names the section, the index of the first call that differs, both lines,
    and a section that appeared or vanished."""
    golden = {"decisions": "### a\nH 1 -> []\nH 2 -> []\n", "logs": "### a\n[]\n[]\n"}
    found = {"decisions": "### a\nH 1 -> []\nH 2 -> [Exit]\n### b\nH 1 -> []\n", "logs": "### a\n[]\n[]\n"}
    first, second = golden_trace.differences(golden, found)
    assert (first.kind, first.section, first.call) == ("decisions", "a", 1)
    assert (first.golden, first.found) == ("H 2 -> []", "H 2 -> [Exit]")
    assert (second.section, second.call, second.golden, second.found) == ("b", 0, None, "H 1 -> []")
