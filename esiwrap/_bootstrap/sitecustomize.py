"""esiwrap's start-up hook: put first on PYTHONPATH by the supervisor for the child's processes.

Inert unless esiwrap's environment variables are set (see `esiwrap.integrations`); then chains
to the `sitecustomize` that would have loaded without us.
"""


def _esiwrap_start() -> None:
    import os
    import sys

    wanted = os.environ.get("ESIWRAP_SOCKET") or os.environ.get("ESIWRAP_RELAY")
    if wanted and os.environ.get("ESIWRAP_HOOK", "1") != "0":
        try:
            from esiwrap.integrations import activate

            activate()
        except Exception as exc:  # never break the user's interpreter
            sys.stderr.write(
                f"esiwrap: integration hook not loaded in {sys.executable}: {exc!r}; install esiwrap "
                "in this environment, or set ESIWRAP_HOOK=0\n"
            )
    _chain_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))


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
