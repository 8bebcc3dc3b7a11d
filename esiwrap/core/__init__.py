"""The decision core: what esiwrap decides, as pure code.

Inputs go in with the time, actions come out; nothing here does I/O or reads a clock, so the
supervisor (`esiwrap.shell`), the simulator (`esiwrap.tools.replay`, `benchmarks/`) and the tests
drive the very same code.

    values      the deadline, a source's answer, the capacity's kind
    policy      when to save: estimates and plans, pure functions of what was observed
    history     the job's runs: the interruption rate learned from them, the no-progress guard
    state       the job's state file's contents (read and written by the shell)
    snapshot    what esiwrap knows at one moment, as one value
    controller  the state machine: its parts, its modes' table, its timers
"""
