"""The ``batchlab`` command line: every subcommand is parsed in this package, and only here.

Each subcommand has an ``add_<name>`` (arguments) and a ``cmd_<name>`` (action) function in the
module of its job; actions turn arguments into the frozen configuration records of the module
that does the work. Knob flags are generated from ``adapters.knobs`` (``common.add_knob_flags``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from harness.cli import calibration, live, offline, sweep
from harness.cli.common import EXIT_USAGE, Parser, UserError

__all__ = ["UserError", "build_parser", "main"]

Command = Callable[[argparse.Namespace], int]

# (name, add arguments, action), in the order `batchlab --help` lists them
_COMMANDS: tuple[tuple[str, Callable[..., None], Command], ...] = (
    ("simulate", offline.add_simulate, offline.cmd_simulate),
    ("costmodel", offline.add_costmodel, offline.cmd_costmodel),
    ("trace", offline.add_trace, offline.cmd_trace),
    ("run", sweep.add_run, sweep.cmd_run),
    ("report", sweep.add_report, sweep.cmd_report),
    ("replay", live.add_replay, live.cmd_replay),
    ("summarize", live.add_summarize, live.cmd_summarize),
    ("engines", live.add_engines, live.cmd_engines),
    ("serve", offline.add_serve, offline.cmd_serve),
    ("calibrate", calibration.add_calibrate, calibration.cmd_calibrate),
    ("validate", calibration.add_validate, calibration.cmd_validate),
)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = Parser(
        prog="batchlab",
        description="Replay real LLM traffic against continuous-batching engines and compare them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands: dict[str, Command] = {}
    for name, add, action in _COMMANDS:
        add(sub)
        commands[name] = action
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
