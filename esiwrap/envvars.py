"""The names of esiwrap's environment variables: one home for every `ESIWRAP_…` name.

No imports: loaded at every interpreter start-up in the child's processes (the zero-code hooks).
`esiwrap/_bootstrap/sitecustomize.py` runs before esiwrap is importable and spells its three
names out; a test holds them equal to these.
"""

from __future__ import annotations

PREFIX = "ESIWRAP_"  # every run option can come from ESIWRAP_<OPTION>, e.g. ESIWRAP_STOP_GRACE

# Exported by esiwrap to the command it runs.
SOCKET_ENV = "ESIWRAP_SOCKET"  # the channel's socket: the trainer library talks only when it is set
SIGNAL_ENV = "ESIWRAP_SIGNAL"  # the save signal (`--signal`), by name
RUN_ID_ENV = "ESIWRAP_RUN_ID"  # the run's `run_id`, as in every log line
# "save": a SIGTERM sent to the trainer itself asks for a save (Slurm signals every process of a
# job); esiwrap then stops the trainer with the signal its hello names. Exported inside Slurm jobs.
TRAINER_SIGTERM_ENV = "ESIWRAP_TRAINER_SIGTERM"
TRAINER_SIGTERM_SAVE = "save"

# Exported by esiwrap to the `--upload`, `--verify` and `--restore` commands.
CHECKPOINT_PATH_ENV = "ESIWRAP_CHECKPOINT_PATH"  # the checkpoint to upload, check or restore (also `{path}`)
CHECKPOINT_STEP_ENV = "ESIWRAP_CHECKPOINT_STEP"  # the step it holds (also `{step}`)
MANIFEST_ENV = "ESIWRAP_MANIFEST"  # `--upload`: the checkpoint's manifest, copied last (also `{manifest}`)
MANIFEST_DIR_ENV = "ESIWRAP_MANIFEST_DIR"  # `--restore-manifests`: where the manifests go (also `{dir}`)

# Read by esiwrap itself (besides the ESIWRAP_<OPTION> settings).
COMMAND_ENV = "ESIWRAP_COMMAND"  # the command when none follows `--` (systemd environment files)
LOG_FILE_ENV = "ESIWRAP_LOG_FILE"  # also the --log-file option's variable
STATUS_FILE_ENV = "ESIWRAP_STATUS_FILE"  # also the --status-file option's variable; `esiwrap status`

# The zero-code hooks (verl, Ray).
HOOK_SWITCH_ENV = "ESIWRAP_HOOK"  # "0" turns the zero-code hooks off
RELAY_ENV = "ESIWRAP_RELAY"  # set by the driver's Ray runtime-env hook: "this Ray job is esiwrap's"
CHAINED_RAY_ENV_HOOK = "ESIWRAP_CHAINED_RAY_RUNTIME_ENV_HOOK"  # a user's Ray env hook, called after ours
CHAINED_SETUP_HOOK_ENV = "ESIWRAP_CHAINED_SETUP_HOOK"  # a user's worker_process_setup_hook, likewise

# Each name above, for the environment-variable reference (`docs/reference/environment.md`, written
# by `scripts/gen_reference.py`): who sets it, and what it means. Plain data: nothing is imported.
EXPORTED = "set by esiwrap for the command"
FOR_UPLOAD = "set by esiwrap for the --upload command"
FOR_COMMANDS = "set by esiwrap for the --upload, --verify and --restore commands"
FOR_MANIFESTS = "set by esiwrap for the --restore-manifests command"
READ = "read by esiwrap"
HOOKS = "the zero-code hooks (verl, Ray)"
DESCRIPTIONS: dict[str, tuple[str, str]] = {
    SOCKET_ENV: (EXPORTED, "the trainer channel's Unix socket; the trainer library sends only when it "
                 "is set, and never blocks on it"),
    SIGNAL_ENV: (EXPORTED, "the save signal's name (`--signal`), e.g. `SIGUSR1`; `install()` registers "
                 "its handler for it"),
    RUN_ID_ENV: (EXPORTED, "the `run_id` of esiwrap's log lines, to tag your own"),
    TRAINER_SIGTERM_ENV: (EXPORTED, "`save` inside a Slurm job (unless you set it): `install()` then takes "
                          "SIGTERM as a save request and asks esiwrap to stop it with SIGHUP; any "
                          "other value keeps SIGTERM's default"),
    CHECKPOINT_PATH_ENV: (FOR_COMMANDS, "the checkpoint to upload or check, as the trainer reported it, or "
                          "where to restore it (also `{path}`)"),
    CHECKPOINT_STEP_ENV: (FOR_COMMANDS, "the step it holds (also `{step}`)"),
    MANIFEST_ENV: (FOR_UPLOAD, "the checkpoint's manifest, written beside it before the upload: copy it "
                   "last, so that a manifest in the store means its checkpoint is all there (also "
                   "`{manifest}`)"),
    MANIFEST_DIR_ENV: (FOR_MANIFESTS, "an empty directory to copy the job's manifests into (also `{dir}`)"),
    COMMAND_ENV: (READ, "the command when none follows `--`, split like a POSIX shell would (how the "
                  "systemd unit gets its command)"),
    HOOK_SWITCH_ENV: (READ, "`0` turns the zero-code hooks off and leaves the child's `PYTHONPATH` as "
                      "it is"),
    RELAY_ENV: (HOOKS, "set by the driver's Ray runtime-env hook in the job's workers: this Ray job is "
                "esiwrap's"),
    CHAINED_RAY_ENV_HOOK: (HOOKS, "a `RAY_RUNTIME_ENV_HOOK` of yours, called after esiwrap's"),
    CHAINED_SETUP_HOOK_ENV: (HOOKS, "a `worker_process_setup_hook` of yours, called after esiwrap's"),
}
