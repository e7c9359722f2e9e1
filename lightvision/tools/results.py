"""The ``env`` block every GPU result file under ``benchmarks/results/`` carries, and the per-name loop of the
comparison drivers that write them."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout


def results_env(command: str) -> dict:
    """``{"gpu", "torch", "triton", "command", "date"}``: the hardware, versions, the producing command (paths inside
    the repository written relative to its root), UTC date."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "command": command.replace(f"{REPO_ROOT}/", ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def run_each(names: Iterable[str], run: Callable[[str], dict], report: dict, path: str | Path) -> dict:
    """``report["results"][name] = run(name)`` for every name, in order; a failure becomes ``{"error": ...}`` so one
    failing name does not lose the others' numbers. ``report`` is written to ``path`` (JSON) and each result printed
    after every name. Returns ``report["results"]``."""
    results = report.setdefault("results", {})
    for name in names:
        try:
            results[name] = run(name)
        except Exception as err:  # noqa: BLE001 - recorded in the report, the loop goes on
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        Path(path).write_text(json.dumps(report, indent=2, default=str))
        print(json.dumps({name: results[name]}, indent=2, default=str), flush=True)
    return results


def add_set_argument(p: argparse.ArgumentParser, help: str) -> None:
    """``--set KEY=VALUE ...``: recipe overrides, repeatable, collected in order into ``args.set``."""
    p.add_argument("--set", nargs="*", default=[], action="extend", metavar="KEY=VALUE", help=help)


def comparison_parser(family: str, description: str, kinds_example: str, set_example: str) -> argparse.ArgumentParser:
    """The arguments every CIFAR-10 comparison driver (``lightvision.{family}.benchmark``) takes: attention kinds,
    ``--data``, ``--out``, ``--work`` (scratch, default ``/tmp/lightvision_{family}_benchmark``) and ``--set``
    (recipe overrides for every kind); the driver adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("kinds", nargs="+", help=f"attention kinds, e.g. {kinds_example}")
    p.add_argument("--data", required=True, help="CIFAR-10 ImageFolder root with train/ and test/")
    p.add_argument("--out", required=True, help=f"results folder ({family}_cifar10.json and plots)")
    p.add_argument("--work", default=f"/tmp/lightvision_{family}_benchmark", help="scratch: runs, checkpoints, samples")
    add_set_argument(p, f"more recipe overrides for every kind, e.g. {set_example!r}")
    p.add_argument(
        "--variants",
        help="YAML of named variants (name: {attention: KIND, set: [KEY=VALUE, ...]}) that the "
        "names may refer to besides the attention kinds, e.g. "
        f"configs/variants/{family}_cifar10.yaml",
    )
    p.add_argument(
        "--tag",
        default="",
        help=f"suffix of the report's name ({family}_cifar10_TAG.json), so that "
        "drivers running side by side write separate files",
    )
    return p


def resolve_variant(name: str, variants_file: str | Path | None, kinds: Iterable[str]) -> tuple[str, list[str]]:
    """(attention kind, recipe overrides) of a name on a comparison driver's command line: a variant of
    ``variants_file`` (``name: {attention: KIND, set: [KEY=VALUE, ...], about: TEXT}``) or a plain attention kind."""
    import yaml

    variants = yaml.safe_load(Path(variants_file).read_text()) if variants_file else {}
    if name in (variants or {}):
        entry = variants[name]
        if entry.get("attention") not in kinds:
            raise ValueError(f"variant {name!r} in {variants_file}: attention must be one of {', '.join(kinds)}")
        return entry["attention"], [str(s) for s in entry.get("set", [])]
    if name not in kinds:
        known = sorted(kinds) + sorted(variants or {})
        raise ValueError(f"unknown attention kind or variant {name!r}; valid: {', '.join(known)}")
    return name, []


def comparison_report(family: str, args: argparse.Namespace, argv: list[str] | None) -> tuple[Path, dict]:
    """``--out`` (created) and the report a comparison driver fills: ``env`` with the command as typed,
    ``settings`` (the parsed arguments) and empty ``results`` for :func:`run_each`; its file is
    ``report_path(family, args)``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join([f"python -m lightvision.{family}.benchmark", *(argv or sys.argv[1:])])
    return out, {"env": results_env(command), "settings": vars(args), "results": {}}


def report_path(family: str, args: argparse.Namespace) -> Path:
    """``--out/{family}_cifar10[_TAG].json``."""
    return Path(args.out) / f"{family}_cifar10{'_' + args.tag if args.tag else ''}.json"
