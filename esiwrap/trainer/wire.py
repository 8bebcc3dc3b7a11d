"""The trainer channel's message types: one home for the names trainers send and esiwrap reads.

No imports: loaded in the trainer's own processes (`esiwrap.trainer`, the verl and Ray hooks, in
Ray workers too). The fields of each message are in `esiwrap.trainer.channel`.
"""

from __future__ import annotations

HELLO = "hello"  # a trainer attaches: its rank, whether it saves, whether to signal it
STEP = "step"  # a step boundary and the step's duration
SAVE_BEGIN = "save_begin"  # a checkpoint save began at a step boundary
SAVE_SNAPSHOT = "save_snapshot"  # an asynchronous save's blocking part is done; training resumes
SAVE_END = "save_end"  # the save is complete on disk (or failed)
BYE = "bye"  # the trainer leaves (its process may live on)
DEADLINE = "deadline"  # another node's deadline answer, relayed by a Ray driver
CHECKPOINT = "checkpoint"  # what a checkpoint holds, once known or when it changed
START = "start"  # where training starts: the step the trainer's state is at (the verl hook, after loading)

ALL = frozenset({HELLO, STEP, SAVE_BEGIN, SAVE_SNAPSHOT, SAVE_END, BYE, DEADLINE, CHECKPOINT, START})
