"""``lightvision classify``: subcommands of this package."""

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``classify`` command group to the top-level parser."""
    group = subparsers.add_parser("classify", help="classify commands")
    group.add_subparsers(dest="classify_command", required=True, metavar="COMMAND")
