"""gpufleet's worker bootstrap (see gpufleet/bootstrap/__init__.py). Python imports this at
startup because gpufleet put this folder first on PYTHONPATH.

It first runs the next `sitecustomize` on the path (the user's or the environment's own), so
putting gpufleet in front takes nothing away; then it arms the bootstrap in a gpufleet worker.
Any failure here is swallowed: a script must never fail because its bootstrap could not start.
"""


def _chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # the user's module is the one others see
    spec.loader.exec_module(module)


def _arm() -> None:
    import os

    if os.environ.get("GPUFLEET_BOOTSTRAP", "1") == "0" or "RANK" not in os.environ:
        return
    armed = os.environ.get("GPUFLEET_BOOTSTRAP_PID")  # a process a rank started: not the rank
    if armed is not None and armed != str(os.getpid()):
        return
    from gpufleet.bootstrap import worker

    worker.arm()


try:
    _chain()
except Exception as exc:  # the user's own sitecustomize failed: say so, as Python would
    import sys as _sys

    print(f"gpufleet bootstrap: the next sitecustomize failed: {exc!r}", file=_sys.stderr)
try:
    _arm()
except Exception as exc:
    import sys as _sys

    print(f"gpufleet bootstrap: not armed ({exc!r})", file=_sys.stderr)
