"""``lightvision diffusion``: subcommands of this package."""

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``diffusion`` command group to the top-level parser."""
    group = subparsers.add_parser("diffusion", help="diffusion commands")
    group.add_subparsers(dest="diffusion_command", required=True, metavar="COMMAND")
