"""Run a callback right after a module is imported, without importing it now (keeps ``import lightvision`` light)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot finder: when ``name`` is first imported, its loader runs the module, then ``callback()``."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the regular finders, this one removed
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            self.callback()

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once module ``name`` is imported: now if it already is, else right after its import."""
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
