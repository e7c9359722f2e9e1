"""``python cli_forks.py OUT_DIR``: runs batches of ``python`` command lines as forks of this one interpreter, which
imported the lightvision command's modules (torch, timm, diffusers, scikit-learn, the train / eval / sample entry
points) once. Each line on stdin is a request, answered by one line of JSON: ``{"start": {name: [argv, env, cwd]}}``
(``argv`` as after ``python``: ``["-m", "lightvision", ...]`` or ``["script.py", ...]``) starts its cases at once, each
in its own process (its own working folder, environment, stdout, stderr, exit code and interpreter shutdown; its
output files in OUT_DIR), answered ``{name: pid}``; ``{"wait": [name, ...]}`` waits for those to end, answered
``{name: [exit code, stdout, stderr]}`` (a signal's exit code is minus its number).

Whatever the imports print goes to this script's stderr (a fresh process would print it too), anything later to the
case's. Used through ``helpers.Forks``."""

from __future__ import annotations

import gc
import importlib
import itertools
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
SERIAL = itertools.count()  # names the cases' output files


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


def start(batch: dict[str, list], out_dir: Path, children: dict) -> dict[str, int]:
    """Fork every case ``{name: [argv, env, cwd]}`` of ``batch`` (into ``children``); ``{name: pid}``."""
    sys.stdout.flush()
    sys.stderr.flush()
    for name, (argv, env, cwd) in batch.items():
        assert name not in children, f"{name!r} is still running"
        serial = next(SERIAL)
        out, err = out_dir / f"{serial}.out", out_dir / f"{serial}.err"
        pid = os.fork()
        if pid == 0:
            run_case(argv, env, cwd, out, err)
        children[name] = (pid, out, err)
    return {name: children[name][0] for name in batch}


def wait(names: list[str], children: dict) -> dict[str, list]:
    """Wait for the started cases ``names`` to end; ``{name: [exit code, stdout, stderr]}``."""
    results = {}
    for name in names:
        pid, out, err = children.pop(name)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        results[name] = [code, out.read_text(), err.read_text()]
    return results


def main() -> int:
    out_dir = Path(sys.argv[1])
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the imported objects stay out of the children's collections: no copy-on-write of the whole heap
    children: dict[str, tuple[int, Path, Path]] = {}
    for line in sys.stdin:
        request = json.loads(line)
        answer = start(request["start"], out_dir, children) if "start" in request else wait(request["wait"], children)
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
