"""The ``lightvision`` command.

One subcommand group per package: ``classify`` (:mod:`lightvision.classify.cli`), ``diffusion``
(:mod:`lightvision.diffusion.cli`), plus ``demo`` (every attention core on a real image grid, checking
that the equivalent forms agree) and ``quickstart`` (the built-in default job of the README).
Heavy imports happen inside the handlers so ``lightvision --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from lightvision import __version__


def _demo(args: argparse.Namespace) -> int:
    from lightvision.demo import run_demo

    return run_demo(device=args.device)


def _quickstart(args: argparse.Namespace) -> int:
    from lightvision.quickstart import run_quickstart

    return run_quickstart(out_dir=args.out, device=args.device)


def build_parser() -> argparse.ArgumentParser:
    from lightvision.classify.cli import register as register_classify
    from lightvision.diffusion.cli import register as register_diffusion

    parser = argparse.ArgumentParser(
        prog="lightvision",
        description="Vision and diffusion models on LightNet (one-scan) and LION (two-scan) attention.",
    )
    parser.add_argument("--version", action="version", version=f"lightvision {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run every attention core on a real image grid and check that equivalent forms agree")
    demo.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    demo.set_defaults(func=_demo)

    quick = sub.add_parser(
        "quickstart",
        help="the built-in default job: core demo, a digits classifier (eval at two resolutions) and a tiny pixel diffusion model",
    )
    quick.add_argument("--out", default="runs/quickstart", help="output folder (default: runs/quickstart)")
    quick.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    quick.set_defaults(func=_quickstart)

    register_classify(sub)
    register_diffusion(sub)
    return parser


def _close_process_group() -> None:
    """Under ``accelerate launch`` with several processes: destroy the process group before exiting, so its
    threads are not torn down by interpreter shutdown (gloo then aborts with "terminate called without an active
    exception", NCCL warns about leaked resources)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = int(args.func(args) or 0)
    _close_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
