"""esiwrap: checkpoint a training run at the last safe moment before its capacity is reclaimed.

The package's folders are its floors; a module imports only its own floor and the ones below:

    (top level)   the names every floor shares: errors and exit codes, events, environment
                  variables, signals, times, the option type
    core/         the decision core: inputs in with the time, actions out; no I/O, no clock
    trainer/      the trainer's side: `import esiwrap.trainer as esi`, the channel
    sources/      where the deadline comes from
    integrations/ frameworks on the trainer's side: verl with no change, Hugging Face, Lightning, Ray
    shell/        the I/O around the core: the supervisor, the process tree, the files, systemd
    tools/        what a person reads afterwards: report, timeline, --what-if, status
    cli/          the command line, on top
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
