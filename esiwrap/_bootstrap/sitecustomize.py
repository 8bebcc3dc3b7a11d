"""esiwrap's start-up hook: put first on PYTHONPATH by the supervisor for the child's processes.

Inert unless esiwrap's environment variables are set (see `esiwrap.integrations`); then chains
to the `sitecustomize` that would have loaded without us.

A Python of the child's tree without esiwrap installed (a shell script's helper, a data tool, an
interpreter of another environment) stays silent: it has nothing to do with training. Only if it
then imports one of verl's trainer modules, and nothing has loaded esiwrap's hooks by then (a Ray
worker gets them from the job's setup hook), does it say once, on stderr, that the hook is missing.
"""

# verl's trainer modules: esiwrap.integrations.VERL_TRAINER_MODULES (a test holds them equal).
_TRAINER_MODULES = frozenset({
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.trainer.main_ppo_sync",
    "verl.trainer.ppo.metric_utils",
})


def _esiwrap_start() -> None:
    import os
    import sys

    wanted = os.environ.get("ESIWRAP_SOCKET") or os.environ.get("ESIWRAP_RELAY")
    if wanted and os.environ.get("ESIWRAP_HOOK", "1") != "0":
        try:
            from esiwrap.integrations import activate

            activate()
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "esiwrap":
                _not_loaded(exc)
            else:  # not installed here: a word only if this Python turns out to train
                sys.meta_path.insert(0, _MissingHookNotice(exc))
        except Exception as exc:  # esiwrap is here but broken: never break the user's interpreter
            _not_loaded(exc)
    _chain_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))


def _not_loaded(exc: BaseException) -> None:
    import sys

    sys.stderr.write(
        f"esiwrap: integration hook not loaded in {sys.executable}: {exc!r}; install esiwrap "
        "in this environment, or set ESIWRAP_HOOK=0\n"
    )


class _MissingHookNotice:
    """A meta-path finder that finds nothing: at the first import of a verl trainer module it
    says, once, that esiwrap's hook is missing, unless esiwrap's verl hooks are in place by then."""

    def __init__(self, exc: BaseException) -> None:
        self._exc: BaseException | None = exc

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        # Done or not a trainer module: find nothing. (It stays on sys.meta_path: removing it
        # while the import walks that list would skip the next finder.)
        if self._exc is None or fullname not in _TRAINER_MODULES:
            return
        import sys

        exc, self._exc = self._exc, None
        integrations = sys.modules.get("esiwrap.integrations")
        if not getattr(integrations, "_verl_hooks_installed", False):
            _not_loaded(exc)


def _chain_next_sitecustomize(here: str) -> None:
    import importlib.machinery
    import os
    import sys

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = type(sys)("sitecustomize")  # importlib.util would cost ~10 ms of imports here
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}\n")


_esiwrap_start()
