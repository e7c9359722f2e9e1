"""The ``lightvision`` command.

One subcommand group per package: ``classify`` (:mod:`lightvision.classify.cli`), ``diffusion``
(:mod:`lightvision.diffusion.cli`), plus ``demo`` (every attention core on a real image grid, checking
that the equivalent forms agree) and ``quickstart`` (the built-in default job of the README).
Heavy imports happen inside the handlers so ``lightvision --help`` stays fast.

Bad input (a missing path, an unknown config key or model, a bad value, unreadable data or checkpoint) ends
with one line ``lightvision: error: ...`` on stderr and exit code 1; ``--debug`` (anywhere on the command line)
or ``LIGHTVISION_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys

from lightvision import __version__

CUDA_QUEUES = 32  # hardware work queues per GPU the command asks CUDA for (CUDA's default 8, its most 32)


def widen_cuda_queues() -> None:
    """Give this process's CUDA streams ``CUDA_QUEUES`` hardware work queues (``CUDA_DEVICE_MAX_CONNECTIONS``)
    unless the environment sets that already. CUDA reads it when the process's context is made, so this runs before
    any command touches the GPU, and child processes inherit it. With CUDA's 8 the process's streams share queues,
    and work on one stream waits behind what is queued on another: nvjpeg's decode of the next batch (the gpu
    pipeline) waited behind the training step's kernels, 14.7 ms a batch against 8.2 ms with 32
    (docs/classify_input.md)."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(CUDA_QUEUES))


def _demo(args: argparse.Namespace) -> int:
    from lightvision.demo import run_demo

    return run_demo(device=args.device)


def _quickstart(args: argparse.Namespace) -> int:
    from lightvision.quickstart import run_quickstart

    return run_quickstart(out_dir=args.out, device=args.device)


def add_train_options(p: argparse.ArgumentParser, out_help: str) -> None:
    """``--out``, ``--device``, ``--resume`` (a flag: it never takes the next word, so ``--resume data.root=X`` keeps
    the override) and ``--resume-from PATH`` of the ``train`` commands; their overrides may come before or after."""
    p.add_argument("--out", help=out_help)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint of the run folder (the built-in job without --config always does)",
    )
    p.add_argument(
        "--resume-from", metavar="PATH", help="continue from this checkpoint folder or run folder (implies --resume)"
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.max_steps=1000")


def resume_setting(args: argparse.Namespace) -> bool | str:
    """What the trainers' ``resume`` takes from ``--resume`` / ``--resume-from PATH``: the path, True or False."""
    return args.resume_from or args.resume


def build_parser() -> argparse.ArgumentParser:
    from lightvision.classify.cli import register as register_classify
    from lightvision.diffusion.cli import register as register_diffusion

    parser = argparse.ArgumentParser(
        prog="lightvision",
        description="Vision and diffusion models on LightNet (one-scan) and LION (two-scan) attention.",
    )
    parser.add_argument("--version", action="version", version=f"lightvision {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (anywhere on the line; or set LIGHTVISION_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="run every attention core on a real image grid and check that equivalent forms agree"
    )
    demo.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    demo.set_defaults(func=_demo)

    quick = sub.add_parser(
        "quickstart",
        help="the built-in default job: core demo, a digits classifier (eval at two resolutions) and a tiny pixel "
        "diffusion model",
    )
    quick.add_argument("--out", default="runs/quickstart", help="output folder (default: runs/quickstart)")
    quick.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    quick.set_defaults(func=_quickstart)

    register_classify(sub)
    register_diffusion(sub)
    return parser


def close_process_group() -> None:
    """Under ``accelerate launch`` with several processes: destroy the process group before exiting, so its
    threads are not torn down by interpreter shutdown (gloo then aborts with "terminate called without an active
    exception", NCCL warns about leaked resources)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (the message says what to change), not a defect of lightvision."""
    types: list[type[BaseException]] = [ValueError, OSError]  # ConfigError is a ValueError
    if "lightvision.engine" in sys.modules:  # imported by whatever raised one of its errors
        from lightvision.engine import CheckpointError, NonFiniteError

        types += [CheckpointError, NonFiniteError]
    if "yaml" in sys.modules:
        import yaml

        types.append(yaml.YAMLError)
    if "torch" in sys.modules:
        import torch

        types.append(torch.cuda.OutOfMemoryError)
    return tuple(types)


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (a FileNotFoundError from open() names its path; an error re-raised from a
    DataLoader worker, whose message carries the worker's traceback, gives its last line)."""
    text = str(err) if not isinstance(err, OSError) or not err.filename else f"{err.strerror}: {err.filename}"
    lines = [part.strip() for part in text.splitlines() if part.strip()]
    if any("Traceback (most recent call last)" in line for line in lines):
        return lines[-1].partition(": ")[2] or lines[-1]  # "ValueError: message" -> "message"
    return " ".join(lines) or type(err).__name__


def _debug_requested(argv: list[str]) -> bool:
    """``--debug`` on the command line or LIGHTVISION_DEBUG set to anything but "" / "0"."""
    return "--debug" in argv or os.environ.get("LIGHTVISION_DEBUG", "") not in ("", "0")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line ``argv`` (without ``--debug``) as parsed arguments. ``key=value`` overrides may also follow
    an option ("a=1 --out D b=2"), as ``parse_intermixed_args`` would take them (it does not work with subcommands)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command (:func:`widen_cuda_queues` first); errors propagate (what tests and
    scripts call)."""
    widen_cuda_queues()
    args = parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a != "--debug"])
    code = int(args.func(args) or 0)
    close_process_group()
    return code


def main(argv: list[str] | None = None) -> int:
    """The ``lightvision`` command: :func:`run`, with bad input reported as one line and exit code 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(argv)
    except KeyboardInterrupt:
        print("lightvision: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if _debug_requested(argv) or not isinstance(err, _user_error_types()):
            raise
        print(f"lightvision: error: {_one_line(err)} (--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
