"""Run a callback right after a module is first imported, without importing it ourselves.

The bootstrap must not import torch in every worker at startup (2-3 s of CPU in a script that
may not use it, and before the script has chosen its own settings). So it watches for the import:
a finder first on `sys.meta_path` answers for the watched names only, lets the other finders
find the module, and wraps the loader so the callback runs once the module's code has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

Callback = Callable[[ModuleType], None]


def _safely(callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as exc:  # a hook must never break the script or its import
        print(f"gpufleet bootstrap: hook for {module.__name__} failed: {exc!r}", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callback):
        self.inner, self.callback = inner, callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        # the module's spec should point at its real loader again (pickling, reload, inspect)
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        module.__loader__ = self.inner
        _safely(self.callback, module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.watched: dict[str, Callback] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        callback = self.watched.pop(fullname, None)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, callback)  # type: ignore[arg-type]
                return spec
        return None


_FINDER = _Finder()


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` once `name` has been imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        _safely(callback, module)
        return
    _FINDER.watched[name] = callback
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def rebind(name: str, inner: object, wrapper: object) -> None:
    """Put `wrapper` in place of `inner` in every loaded module that binds it as `name`: the
    defining module and those that re-export it (imported before the bootstrap was armed, as in
    a warm rank's forkserver), or `from torch.distributed import NAME` would call around it.
    By name, one lookup per module (about 2,000 with torch): every binding of every module
    would take a rank's start tens of milliseconds."""
    for loaded in list(sys.modules.values()):
        # its __dict__, not getattr: a module's own __getattr__ may import things
        names = getattr(loaded, "__dict__", None)
        if isinstance(names, dict) and names.get(name) is inner:
            setattr(loaded, name, wrapper)
