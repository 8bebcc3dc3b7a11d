"""What a person reads afterwards, from a run's log or a running esiwrap's status file: the report,
the timeline, `--what-if` (a run replayed through the core on a simulated clock, `replay`),
`esiwrap status`, and `esiwrap docs` (where the documentation is). Nothing here decides.
"""
