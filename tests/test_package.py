"""The installed package: namespace mapping, nothing generic in site-packages, the CLI surface."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import lightvision

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, folder", [("kernels", "kernels"), ("classify", "classify"), ("diffusion", "diffusion")])
def test_top_level_folders_install_under_the_namespace(name, folder):
    module = __import__(f"lightvision.{name}", fromlist=["_"])
    assert Path(module.__file__).resolve().parent == (REPO / folder).resolve()


def test_installed_distribution_adds_no_generic_top_level_module(tmp_path):
    # Run from an empty folder so the checkout itself is not on sys.path: only what was installed is seen.
    probe = (
        "import importlib.util, importlib.metadata as m;"
        "print([str(f) for f in m.distribution('lightvision').files]);"
        "print([n for n in ('kernels', 'classify', 'diffusion') if importlib.util.find_spec(n)])"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    files_line, generic_line = out.stdout.strip().splitlines()
    assert generic_line == "[]", f"generic top-level modules importable: {generic_line}"
    files = [Path(f) for f in eval(files_line)]  # a printed list of str
    strays = [
        f
        for f in files
        if not (
            f.parts[0].startswith(("lightvision", "__editable__"))
            or f.parts[0] in {"..", "bin"}
            or (f.parts[0] == "__pycache__" and f.name.startswith("__editable__"))
        )
    ]
    assert files and not strays, strays


def test_wheel_contains_only_the_lightvision_package(tmp_path):
    """Built from a copy of the checkout: a build in place would leave setuptools' build/ folder in it."""
    before = sorted(p.name for p in REPO.iterdir())
    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".git", "build", "dist", "runs", "data", "*.egg-info", "__pycache__", ".*cache")
    shutil.copytree(REPO, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), source],
        check=True,
    )
    assert sorted(p.name for p in REPO.iterdir()) == before
    (wheel,) = tmp_path.glob("lightvision-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"lightvision", f"lightvision-{lightvision.__version__}.dist-info"}, tops
    packages = [
        init.relative_to(REPO)
        for folder in ("lightvision", "kernels", "classify", "diffusion")
        for init in (REPO / folder).rglob("__init__.py")
    ]  # every package of the checkout is installed
    missing = [str(p) for p in packages if str(p if p.parts[0] == "lightvision" else "lightvision" / p) not in names]
    assert packages and not missing, f"packages left out of pyproject.toml's [tool.setuptools] packages: {missing}"
    assert not any(n.startswith(("kernels/", "classify/", "diffusion/", "tests/")) for n in names)
    tools = [n for n in names if Path(n).stem in ("check", "bench")]  # GPU sweeps and benchmarks live in scripts/
    assert not tools, tools
    # the drivers' result and figure helpers sit in lightvision/tools/, not among the library's modules
    top_modules = {n for n in names if n.count("/") == 1 and n.endswith(".py")}
    assert not top_modules & {"lightvision/results.py", "lightvision/attention_figures.py"}, top_modules
    assert {"lightvision/tools/results.py", "lightvision/tools/attention_figures.py"} <= set(names)
    assert "lightvision/weights/cifar10_yardstick.safetensors" in names  # the packaged FID feature network


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lightvision", *args], capture_output=True, text=True, timeout=120)


def test_cli_version_and_help():
    out = _cli("--version")
    assert out.returncode == 0 and lightvision.__version__ in out.stdout
    out = _cli("--help")
    assert out.returncode == 0
    for command in ("demo", "quickstart", "classify", "diffusion"):
        assert command in out.stdout


@pytest.mark.parametrize("group", ["classify", "diffusion"])
def test_cli_groups_explain_their_subcommands(group):
    out = _cli(group, "--help")
    assert out.returncode == 0, out.stderr
    assert "train" in out.stdout


def test_cli_unknown_command_fails_clearly():
    out = _cli("nope")
    assert out.returncode != 0 and "invalid choice" in out.stderr
