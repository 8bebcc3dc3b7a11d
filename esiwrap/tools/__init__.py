"""What a person reads afterwards, from a run's log or a running esiwrap's status file: the report,
the timeline, `--what-if` (a run replayed through the core on a simulated clock, `replay`) and
`esiwrap status`. Nothing here decides.
"""
