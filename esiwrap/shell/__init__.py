"""The shell: esiwrap's I/O around the decision core.

One thread, one selector (`supervisor`); the child and its tree (`process`, `tree`), signals from
the first millisecond (`early`), the helpers (the storage probe, the upload, the look at what
holds a checkpoint), the writers that keep the loop off the disk (`writer`, `files`, `log`,
`statefile`), what others read while it runs (`observe`, `metrics`, `endpoint`, `statusfile`) and
systemd (`systemd`). It carries out the core's actions and decides nothing the core can decide.
"""
