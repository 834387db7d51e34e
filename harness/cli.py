"""The ``batchlab`` command line: every subcommand is parsed here, and only here.

Each subcommand has an ``_add_<name>`` (arguments) and a ``_cmd_<name>`` (action) function;
actions turn arguments into the frozen configuration records of the module that does the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UserError(Exception):
    """A problem with the user's input (file, field, knob): printed without a traceback."""


# ---------------------------------------------------------------- trace options (shared)


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    """Trace options shared by simulate, replay, validate. (Filled in with harness.traces.)"""
    p.add_argument("--trace", help="trace file (Azure CSV, Mooncake JSONL[.gz], ...)")


# ---------------------------------------------------------------- main


Command = Callable[[argparse.Namespace], int]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog="batchlab",
        description="Replay real LLM traffic against continuous-batching engines and compare them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, Command] = {}
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    try:
        return commands[args.command](args)
    except UserError as exc:
        print(f"batchlab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"batchlab {args.command}: interrupted; results measured so far are on disk",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
