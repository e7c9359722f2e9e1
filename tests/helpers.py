"""The comparison helper of the whole suite: relative L2 error against a reference (docs/spec.md 2); tiny data and
models for the training tests; :func:`load_script` for the tests of ``scripts/``; :class:`Forks` for command lines
run as real processes without each paying the torch start-up.

Tests import them as ``from helpers import TOL, assert_close, rel`` (pytest puts ``tests/`` on ``sys.path``
through the root conftest)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

# Relative L2 error allowed against an fp64 reference, per dtype of the tested output (docs/spec.md 2).
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| in fp64, on the CPU.

    Args:
        a: the tested tensor; must be finite (a NaN marks an output element a kernel never wrote).
        ref: the reference, same shape as ``a``, any dtype or device.

    Returns:
        The relative error as a Python float.
    """
    assert a.shape == ref.shape, (a.shape, ref.shape)
    assert torch.isfinite(a).all(), "non-finite element: an output was not written"
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    return float((a - ref).norm() / ref.norm())


def assert_close(a: torch.Tensor, ref: torch.Tensor, tol: float | None = None, name: str = "") -> None:
    """Assert ``rel(a, ref) < tol``; ``tol`` defaults to ``TOL[a.dtype]``. ``name`` labels the failure."""
    tol = TOL[a.dtype] if tol is None else tol
    err = rel(a, ref)
    assert err < tol, f"{name or 'output'}: relative error {err:.3g} >= {tol:g}"


def digits_classifier(run_dir, **overrides):
    """A checkpoint of the built-in digits classifier recipe (1 channel, untrained weights)."""
    from lightvision.classify.default import DIGITS_RECIPE
    from lightvision.classify.deit import create_from_config
    from lightvision.classify.train import load_recipe, model_config
    from lightvision.engine.checkpoint import CheckpointManager

    cfg = load_recipe(None, [*DIGITS_RECIPE, *[f"{k}={v}" for k, v in overrides.items()]])
    mcfg = model_config(cfg, 10)
    model = create_from_config(mcfg)
    CheckpointManager(run_dir).save(1, models={"model": model}, model_config=mcfg, train_state={"step": 1}, config=cfg)
    return str(run_dir)


def tiny_classify_recipe(
    tmp_path, data, model: str = "lightnet_deit_tiny_patch16_224", ema_decay: str = "0.9", **data_keys: str
):
    """A classifier recipe file of a 1-block DeiT at 16 px (patch 4) for 2 epochs on ``data`` (``data_keys`` go to
    its ``data`` section, e.g. ``pipeline="gpu"``); returns its path."""
    path = tmp_path / "recipe.yaml"
    extra = "".join(f"  {k}: {v}\n" for k, v in data_keys.items())
    path.write_text(
        f"model:\n  name: {model}\n  drop_path: 0.0\n"
        "  args: {patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}\n"
        f"data:\n  root: {data}\n  image_size: 16\n  num_workers: 0\n{extra}"
        "aug:\n  repeated_aug: 1\n"
        "sched:\n  epochs: 2\n  warmup_epochs: 1\n"
        "train:\n  batch_size: 4\n  eval_batch_size: 8\n  mixed_precision: 'no'\n"
        f"  ema_decay: {ema_decay}\n  log_every: 1\n"
    )
    return path


def write_dark_light_folder(root, per_class: int = 4, suffix: str = ".png", varied_sizes: bool = False) -> None:
    """root/{train,val}/{dark,light}/<i><suffix>: dark (mean 40) vs light (mean 200) noisy RGB images, a learnable
    task; 20 x 20, or with ``varied_sizes`` H and W drawn from [20, 48). JPEGs are written at quality 90."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label, base in (("dark", 40), ("light", 200)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):
                h, w = rng.integers(20, 48, 2) if varied_sizes else (20, 20)
                pixels = np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}{suffix}", **({"quality": 90} if suffix == ".jpg" else {}))


def load_script(name: str):
    """``scripts/{name}.py`` imported as module ``name`` (registered in ``sys.modules``, so that worker pools can
    pickle its functions by module name)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Forks:
    """``python`` command lines (``["-m", "lightvision", ...]`` or ``[script, ...]``) run as real processes, forks of
    one interpreter that imported the lightvision command's modules once (tests/cli_forks.py): the torch start-up is
    paid once, not per process. ``start`` a batch of them (their pids back), ``wait`` for them, or ``run`` (both);
    ``close`` ends the server and asserts that its imports printed nothing."""

    def __init__(self, out_dir: Path):
        env = {k: v for k, v in os.environ.items() if k != "LIGHTVISION_DEBUG"}
        self.server = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("cli_forks.py")), str(out_dir)],
            env=env,
            cwd=out_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _ask(self, request: dict) -> dict:
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        line = self.server.stdout.readline()
        assert line, f"the fork server ended: {self.server.stderr.read()[-2000:]}"
        return json.loads(line)

    def start(self, cases: dict[str, tuple[list, dict[str, str], Path]]) -> dict[str, int]:
        """Start ``{name: (argv, env, cwd)}`` at once (``env`` the whole environment) -> ``{name: pid}``."""
        return self._ask(
            {"start": {name: [[str(a) for a in argv], env, str(cwd)] for name, (argv, env, cwd) in cases.items()}}
        )

    def wait(self, *names: str) -> dict[str, tuple[int, str, str]]:
        """Wait for the started ``names`` -> ``{name: (exit code, stdout, stderr)}``; a process ended by a signal
        has minus its number as exit code."""
        return {name: tuple(result) for name, result in self._ask({"wait": list(names)}).items()}

    @staticmethod
    def running(pid: int) -> bool:
        """Whether the started process ``pid`` is still running (ended but not yet waited for counts as ended)."""
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
        except FileNotFoundError:
            return False

    def run(self, cases: dict[str, tuple[list, dict[str, str], Path]]) -> dict[str, tuple[int, str, str]]:
        """:meth:`start` the cases, :meth:`wait` for all of them."""
        return self.wait(*self.start(cases))

    def close(self) -> None:
        _, err = self.server.communicate(timeout=60)
        assert self.server.returncode == 0 and not err, err[-2000:]  # the imports print nothing
