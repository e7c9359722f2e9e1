"""``python cli_forks.py OUT_DIR``: runs batches of ``python`` command lines as forks of this one interpreter, which
imported the lightvision command's modules (torch, timm, diffusers, scikit-learn, the train / eval / sample entry
points) once. Each line on stdin is a batch ``{name: [argv, env, cwd]}``, ``argv`` as after ``python``
(``["-m", "lightvision", ...]`` or ``["script.py", ...]``); its cases start all at once, each in its own process (its
own working folder, environment, stdout, stderr, exit code and interpreter shutdown; its output files in OUT_DIR), and
the answer is one line ``{name: [exit code, stdout, stderr]}`` of JSON (a signal's exit code is minus its number).

Whatever the imports print goes to this script's stderr (a fresh process would print it too), anything later to the
case's. Used through ``helpers.Forks``."""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import sys
from pathlib import Path

PRELOAD = (
    "lightvision.cli",
    "lightvision.classify.default",
    "lightvision.classify.train",
    "lightvision.classify.evaluate",
    "lightvision.diffusion.default",
    "lightvision.diffusion.train",
    "lightvision.diffusion.sample",
    "sklearn.datasets",  # the digits default's data
    "sklearn.model_selection",
)


def run_case(argv: list[str], env: dict[str, str], cwd: str, out: Path, err: Path) -> None:
    """In the forked child: ``python ARGV`` in ``cwd`` with ``env``, stdout / stderr to the files. Never returns:
    exits the way the interpreter would (exit code, or an uncaught exception's traceback)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, out, os.O_WRONLY | os.O_CREAT),
        (2, err, os.O_WRONLY | os.O_CREAT),
    ):
        handle = os.open(path, flags)
        os.dup2(handle, fd)
        os.close(handle)
    if argv[0] == "-m":
        sys.path[0] = cwd  # where ``python -m`` looks first
        sys.argv = argv[1:]  # runpy puts the module's file first, as ``-m`` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def run_batch(batch: dict[str, list], out_dir: Path, serial: int) -> dict[str, list]:
    """Fork every case of ``batch``, wait for all; ``{name: [exit code, stdout, stderr]}``."""
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for i, (name, (argv, env, cwd)) in enumerate(batch.items()):
        out, err = out_dir / f"{serial}-{i}.out", out_dir / f"{serial}-{i}.err"
        pid = os.fork()
        if pid == 0:
            run_case(argv, env, cwd, out, err)
        children[name] = (pid, out, err)
    results = {}
    for name, (pid, out, err) in children.items():
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        results[name] = [code, out.read_text(), err.read_text()]
    return results


def main() -> int:
    out_dir = Path(sys.argv[1])
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the imported objects stay out of the children's collections: no copy-on-write of the whole heap
    for serial, line in enumerate(sys.stdin):
        print(json.dumps(run_batch(json.loads(line), out_dir, serial)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
