"""Which package may import which, read from the source (ast): the library below the families, the families
side by side, the drivers' helpers (lightvision.tools) above the library."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ["lightvision/ops", "lightvision/layers", "lightvision/engine", "kernels"]


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def importers(folders: list[str], prefix: str) -> dict[str, list[str]]:
    """{source file: the imports of ``prefix`` (or its submodules) it makes} over the .py files of ``folders``."""
    found = {}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            hits = sorted(m for m in imported_modules(path) if m == prefix or m.startswith(prefix + "."))
            if hits:
                found[str(path.relative_to(REPO))] = hits
    return found


def test_the_import_reader_sees_nested_and_from_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import a.b\n\ndef f():\n    from lightvision.classify import data\n    from . import rel\n")
    assert imported_modules(source) == {"a.b", "lightvision.classify", "lightvision.classify.data"}


@pytest.mark.parametrize(
    "folder, other", [("diffusion", "lightvision.classify"), ("classify", "lightvision.diffusion")]
)
def test_a_family_does_not_import_the_other(folder, other):
    assert importers([folder], other) == {}


@pytest.mark.parametrize("prefix", ["lightvision.tools", "lightvision.classify", "lightvision.diffusion"])
def test_the_library_imports_no_family_and_no_driver_helper(prefix):
    assert importers(LIBRARY, prefix) == {}


def test_kernels_call_no_public_op():
    """A public op of lightvision.ops dispatches to the kernels: a kernel calling one would route back through the
    dispatcher, so kernels import only the ops' helpers (constants, head reshapes, the kernel registry)."""
    from lightvision.ops._dispatch import _FAMILY

    calls = {}
    for path in sorted((REPO / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightvision.ops"):
                ops = [alias.name for alias in node.names if alias.name in _FAMILY]
                if ops:
                    calls[str(path.relative_to(REPO))] = ops
    assert calls == {}
