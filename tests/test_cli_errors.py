"""The `lightvision` command on bad input: one line naming the problem, a non-zero exit, no traceback unless
--debug or LIGHTVISION_DEBUG=1 asks for it; `--help` imports neither torch nor timm. Real processes, all started at
once: forks of one interpreter that imported the command's modules (cli_forks.py), so that the torch start-up is
paid once, not per case (helpers.Forks); `--help` runs in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import Forks

CASES = {  # name: (arguments, extra environment, pattern the error line must match)
    "missing recipe": (["classify", "train", "--config", "{tmp}/nope.yaml"], {}, r"recipe .*nope\.yaml not found"),
    "unknown key": (
        ["classify", "train", "optim.lrr=1"],
        {},
        r"unknown config key 'optim\.lrr'.*did you mean optim\.lr",
    ),
    "unknown model": (
        ["classify", "train", "--device", "cpu", "--out", "{tmp}/m", "model.name=vit_nope"],
        {},
        r"unknown model 'vit_nope'",
    ),
    "missing data": (
        [
            "classify",
            "train",
            "--device",
            "cpu",
            "--out",
            "{tmp}/d",
            "data.source=imagefolder",
            "data.in_chans=3",
            "data.root={tmp}/no-data",
        ],
        {},
        r"data folder .*no-data does not exist",
    ),
    "no checkpoint": (
        ["classify", "eval", "--checkpoint", "{tmp}", "--img-size", "16", "--device", "cpu"],
        {},
        r"no latest checkpoint in",
    ),
    "sample count": (
        ["diffusion", "sample", "{tmp}", "--out", "{tmp}/samples", "--num-samples", "0"],
        {},
        r"--num-samples must be a positive integer, got 0",
    ),
    "unknown pipeline": (
        ["classify", "train", "--device", "cpu", "--out", "{tmp}/p", "data.pipeline=tpu"],
        {},
        r"unknown data\.pipeline 'tpu'; valid: 'cpu', 'gpu'",
    ),
    "no shards": (
        [
            "classify",
            "train",
            "--device",
            "cpu",
            "--out",
            "{tmp}/s",
            "data.source=imagefolder",
            "data.in_chans=3",
            "data.format=shards",
            "data.root={tmp}",
        ],
        {},
        r"no shard index .*train\.json: make the shards with",
    ),
    "synthetic shards": (
        ["classify", "train", "--device", "cpu", "--out", "{tmp}/y", "data.source=synthetic", "data.format=shards"],
        {},
        r"data\.source=synthetic reads no files .*data\.format=shards and data\.cache=device do not apply to it",
    ),
    "sampler typo": (
        ["diffusion", "train", "--device", "cpu", "--out", "{tmp}/t", "sample.sampler=ddimm"],
        {},
        r"unknown sample\.sampler 'ddimm'; valid: 'ddpm', 'ddim'",
    ),
    "empty lr": (
        ["classify", "train", "--device", "cpu", "--out", "{tmp}/l", "optim.lr="],
        {},
        r"optim\.lr has no value \(an empty 'optim\.lr=' reads as null\): give a number above 0",
    ),
    "fewer classes": (
        ["diffusion", "train", "--device", "cpu", "--out", "{tmp}/c", "data.num_classes=1"],
        {},
        r"data\.num_classes=1 is smaller than the 10 classes of the training data: set data\.num_classes=10",
    ),
    "debug flag": (["classify", "train", "optim.lrr=1", "--debug"], {}, None),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    env = {k: v for k, v in os.environ.items() if k != "LIGHTVISION_DEBUG"}
    forks = Forks(tmp_path_factory.mktemp("forks"))
    cases = {
        name: (["-m", "lightvision", *(a.format(tmp=tmp) for a in args)], {**env, **extra}, tmp)
        for name, (args, extra, _) in CASES.items()
    }
    results = {name: ((out, err), code) for name, (code, out, err) in forks.run(cases).items()}
    forks.close()
    return tmp, results


@pytest.mark.parametrize("name", [n for n, (*_, pattern) in CASES.items() if pattern])
def test_bad_input_gets_one_line(runs, name):
    tmp, results = runs
    (_, stderr), code = results[name]
    lines = stderr.strip().splitlines()
    assert code == 1 and "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("lightvision: error: "), stderr
    assert re.search(CASES[name][2], lines[0]), lines[0]
    folder = {"sample count": "samples", "sampler typo": "t", "empty lr": "l"}.get(name)
    assert folder is None or not (tmp / folder).exists()  # refused before anything is written


def test_debug_shows_the_traceback(runs):
    (_, stderr), code = runs[1]["debug flag"]
    assert code != 0 and "Traceback" in stderr and "ConfigError: unknown config key 'optim.lrr'" in stderr


def test_debug_environment_variable_lets_the_error_through(monkeypatch, capsys):
    from lightvision import cli
    from lightvision.engine import ConfigError

    assert cli.main(["classify", "train", "optim.lrr=1"]) == 1
    assert capsys.readouterr().err.startswith("lightvision: error: unknown config key")
    monkeypatch.setenv("LIGHTVISION_DEBUG", "1")
    with pytest.raises(ConfigError, match="optim.lrr"):
        cli.main(["classify", "train", "optim.lrr=1"])


@pytest.mark.parametrize("family", ["classify", "diffusion"])
def test_train_options_leave_the_overrides_alone(family):
    """Overrides may follow an option; --resume is a flag that never takes the next word; --resume-from takes a path."""
    from lightvision.cli import parse_args

    args = parse_args(
        [family, "train", "--config", "r.yaml", "data.root=X", "--out", "Y", "train.max_steps=1", "--resume", "a.b=2"]
    )
    assert args.overrides == ["data.root=X", "train.max_steps=1", "a.b=2"]
    assert (args.config, args.out, args.resume, args.resume_from) == ("r.yaml", "Y", True, None)
    args = parse_args([family, "train", "--resume-from", "runs/a", "--device", "cpu", "x=1"])
    assert (args.resume, args.resume_from, args.overrides) == (False, "runs/a", ["x=1"])
    with pytest.raises(SystemExit):  # an unknown option is still refused
        parse_args([family, "train", "x=1", "--outt", "Y"])
    with pytest.raises(SystemExit):  # and a stray word where no overrides are taken
        parse_args(["classify", "eval", "runs/a", "--img-size", "16", "--device", "cpu", "24"])


def test_help_imports_no_torch():
    probe = "import sys, lightvision.cli as c; c.build_parser(); print(sorted({'torch', 'timm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    out = subprocess.run([sys.executable, "-m", "lightvision", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--debug" in out.stdout


def test_import_lightvision_registers_the_models_when_timm_comes_later():
    probe = (
        "import importlib.util, sys, lightvision; assert 'timm' not in sys.modules; "
        "assert importlib.util.find_spec('timm') and 'timm' not in sys.modules; "  # a probe as libraries make
        "import timm; print(len(timm.list_models('*_deit_*')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "24"


def test_worker_errors_keep_only_their_message():
    from lightvision.cli import _one_line

    err = ValueError(
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in loop\nValueError: 50 unreadable images in a row near a.jpg'
    )
    assert _one_line(err) == "50 unreadable images in a row near a.jpg"
    assert _one_line(FileNotFoundError(2, "No such file or directory", "x.yaml")) == "No such file or directory: x.yaml"


def test_device_names_are_checked(monkeypatch):
    import torch

    from lightvision.engine.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="no GPU is visible; use --device cpu"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="must be auto, cpu, cuda or cuda:N, got 'gpu'"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"


def test_commands_ask_cuda_for_32_hardware_queues(monkeypatch, capsys):
    """The command asks CUDA for 32 hardware queues before anything touches the GPU; a value already set is kept."""
    from lightvision import cli

    environ = {key: value for key, value in os.environ.items() if key != "CUDA_DEVICE_MAX_CONNECTIONS"}
    monkeypatch.setattr(os, "environ", environ)
    with pytest.raises(SystemExit):
        cli.run(["--help"])
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # a launcher's own choice
    with pytest.raises(SystemExit):
        cli.run(["--help"])
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
