"""Where the deadline comes from: one module per source, the registry that builds them from the run
options, the chain that asks them (`chain.ask`: nothing a source raises gets past it), answers
from other machines (`remote`), and the watcher that asks them off the supervisor's loop.

The sources are imported by name (`registry`): this package's import stays light.
"""
