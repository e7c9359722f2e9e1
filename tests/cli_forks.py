"""``python cli_forks.py CASES.json``: every case ``{name: [argv, env, cwd]}`` of the file as ``python -m lightvision
ARGV``, all at once, each in its own forked process (its own working folder, environment, stdout, stderr, exit code
and interpreter shutdown; its output files beside CASES.json); prints ``{name: [exit code, stdout, stderr]}`` as
JSON.

The command's modules (torch, timm, diffusers, scikit-learn, the train / eval / sample entry points) are imported
once, before the forks, so the cases share the interpreter and import start-up; whatever those imports print goes to
this script's stderr (a fresh process would print it too), anything later to the case's."""

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
    """In the forked child: ``python -m lightvision ARGV`` in ``cwd`` with ``env``, stdout / stderr to the files.
    Never returns: exits the way the interpreter would (exit code, or an uncaught exception's traceback)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    sys.path[0] = cwd  # where ``python -m`` looks first
    sys.argv = ["lightvision", *argv]  # runpy puts the path of lightvision/__main__.py first, as ``-m`` does
    runpy.run_module("lightvision", run_name="__main__", alter_sys=True)
    sys.exit(0)


def main() -> int:
    path = Path(sys.argv[1])
    cases = json.loads(path.read_text())
    for name in PRELOAD:
        importlib.import_module(name)
    gc.freeze()  # the imported objects stay out of the children's collections: no copy-on-write of the whole heap
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for i, (name, (argv, env, cwd)) in enumerate(cases.items()):
        out, err = path.with_name(f"{i}.out"), path.with_name(f"{i}.err")
        pid = os.fork()
        if pid == 0:
            run_case(argv, env, cwd, out, err)
        children[name] = (pid, out, err)
    results = {}
    for name, (pid, out, err) in children.items():
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        results[name] = [code, out.read_text(), err.read_text()]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
