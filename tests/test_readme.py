"""README.md as a user meets it: its Python blocks (and docs/guide.md's) run as written (a block preceded by a
``readme-test: supplies`` comment gets that stand-in from the test), its set-up commands are the ones CI runs, its
links and anchors resolve, and the recipes it names write separate run folders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "docs" / "guide.md"]
SETUP = "pip install -e . && lightvision quickstart"
TESTS = 'pip install -e ".[test]" && python -m pytest -q'


def python_blocks(page: Path = README) -> list[tuple[str | None, str]]:
    """(what the test supplies or None, code) of every fenced python block of ``page``, in order."""
    found = re.findall(r"(?:<!-- readme-test: supplies (\S+) -->\n)?```python\n(.*?)```", page.read_text(), re.S)
    return [(supplied or None, code) for supplied, code in found]


class FakeCIFAR10:
    """``torchvision.datasets.CIFAR10`` without the download: three 32 x 32 images per split."""

    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root, train=True, download=False):
        self.items = [(Image.new("RGB", (32, 32), (i, 0, 0)), i + (0 if train else 5)) for i in range(3)]

    def __iter__(self):
        return iter(self.items)


def supply(what: str, monkeypatch) -> None:
    if what == "torchvision.datasets.CIFAR10":
        import torchvision.datasets

        monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    else:
        raise AssertionError(f"README block asks for {what!r}, which the test does not supply")


def test_readme_has_python_blocks_and_marks_the_one_that_downloads():
    blocks = python_blocks()
    assert len(blocks) >= 2
    for supplied, code in blocks:
        assert ("download=True" in code) == (supplied == "torchvision.datasets.CIFAR10")


@pytest.mark.parametrize(
    "page, index", [(page, i) for page in PAGES for i in range(len(python_blocks(page)))], ids=lambda x: str(x)[-12:]
)
def test_python_block_runs_as_written(page, index, tmp_path, monkeypatch):
    supplied, code = python_blocks(page)[index]
    monkeypatch.chdir(tmp_path)
    if supplied:
        supply(supplied, monkeypatch)
    torch.manual_seed(0)
    exec(compile(code, f"{page.name} python block {index}", "exec"), {"__name__": "readme"})
    if supplied == "torchvision.datasets.CIFAR10":
        assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("data/cifar10/*/*/*.png")) == [
            "data/cifar10/test/dog/00000.png",
            "data/cifar10/test/frog/00001.png",
            "data/cifar10/test/horse/00002.png",
            "data/cifar10/train/airplane/00000.png",
            "data/cifar10/train/automobile/00001.png",
            "data/cifar10/train/bird/00002.png",
        ]


def test_setup_commands_are_the_ones_ci_runs():
    lines = README.read_text().splitlines()
    assert f"    {SETUP}" in lines and f"    {TESTS}" in lines
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == TESTS


def test_cpu_only_install_takes_torch_and_torchvision_from_one_index_in_one_command():
    """Separately, ``pip install -e .`` replaced a CPU-index torch with PyPI's CUDA build to satisfy the newest
    torchvision; in one command the index supplies a matching pair, within the project's torch bound."""
    (line,) = [line for line in README.read_text().splitlines() if "download.pytorch.org/whl/cpu" in line]
    words = line.split()
    assert words[:2] == ["pip", "install"] and "torchvision" in words
    torch_spec = next(w.strip("\"'") for w in words if re.fullmatch(r"[\"']?torch[<>=!~][^\"']*[\"']?", w))
    (torch_dependency,) = re.findall(r'"(torch>[^"]*)"', (ROOT / "pyproject.toml").read_text())
    upper = torch_dependency.split(",")[-1]
    assert torch_spec == f"torch{upper}"


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown``."""
    headings = re.findall(r"(?m)^#{1,6} (.+)$", re.sub(r"(?s)```.*?```", "", markdown))
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_and_anchors_resolve(page):
    links = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    for link in links:
        if link.startswith("http"):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), link
        if anchor:
            assert anchor in anchors(target.read_text()), link


def test_readme_is_a_short_users_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for heading in ("Install", "Your data", "Train a classifier", "Evaluate at other sizes", "Python API", "Citing"):
        assert re.search(rf"(?m)^#+ {heading}$", text), heading
    assert not re.search(r"(?i)\b(earlier default|that is the default now|have not been run yet)\b", text)


def test_cifar10_classifier_and_diffusion_recipes_write_separate_run_folders():
    classify = yaml.safe_load((ROOT / "configs" / "classify" / "cifar10.yaml").read_text())["run"]["dir"]
    diffusion = yaml.safe_load((ROOT / "configs" / "diffusion" / "cifar10.yaml").read_text())["run"]["dir"]
    assert classify != diffusion
    assert f"`{classify}`" in README.read_text() and f"`{diffusion}`" in README.read_text()
