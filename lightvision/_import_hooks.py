"""Run a callback right after a module is imported, without importing it now (keeps ``import lightvision`` light)."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finder that hands out ``name``'s regular spec with a loader that runs ``callback()`` after the module; it
    leaves ``sys.meta_path`` once the module has run (a ``find_spec`` probe without import keeps it in place)."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name:
            return None
        finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        spec = next((s for f in finders if (s := f.find_spec(fullname, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once module ``name`` is imported: now if it already is, else right after its import."""
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
