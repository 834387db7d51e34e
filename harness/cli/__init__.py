"""The ``batchlab`` command line: every subcommand is parsed in this package, and only here.

Each subcommand has an ``add_<name>`` (arguments) and a ``cmd_<name>`` (action) function in the
module of its job; actions turn arguments into the frozen configuration records of the module
that does the work. Knob flags are generated from ``adapters.knobs`` (``common.add_knob_flags``).

``main`` is where every command ends the same way:

- SIGTERM and SIGHUP are Ctrl-C (``timeout``, systemd and Kubernetes stop with SIGTERM): what
  is in flight is recorded as ``not_finished``, the summary is written, the manifest says
  "interrupted", and the exit status is 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).
  A signal batchlab was started with ignored (``nohup``) stays ignored. The same signal again
  within a second is the same request to stop (``timeout`` sends it to the process and to
  its group): it does not interrupt the recording of what was in flight.
- a usage error, an unwritable file or a full disk is one line on stderr, never a traceback;
- a closed stdout (``batchlab engines | head -1``) ends the command quietly.

``run`` (the ``batchlab`` executable, ``python -m harness.cli``) is ``main`` followed by a
quick exit: a simulated run leaves millions of small objects, and freeing them one by one at
interpreter exit took longer than writing its report. Output is flushed and the exit handlers
run first; with a non-daemon thread still alive (none should be) the exit is the normal one.

Command modules load lazily: ``main`` imports only the chosen subcommand's module (``simulate``
never imports the live client or the calibration code); ``--help``, no command or an unknown
one builds the whole parser, so every command is listed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from harness.cli.common import EXIT_FAILURE, EXIT_USAGE, Parser, UserError

__all__ = ["UserError", "build_parser", "main", "run"]

Command = Callable[[argparse.Namespace], int]

# (name, module in harness.cli, its add-arguments and action functions), in the order
# `batchlab --help` lists them. Modules are imported only when their command is built.
_COMMANDS: tuple[tuple[str, str, str, str], ...] = (
    ("simulate", "offline", "add_simulate", "cmd_simulate"),
    ("costmodel", "offline", "add_costmodel", "cmd_costmodel"),
    ("trace", "offline", "add_trace", "cmd_trace"),
    ("run", "sweep", "add_run", "cmd_run"),
    ("report", "sweep", "add_report", "cmd_report"),
    ("compare", "compare", "add_compare", "cmd_compare"),
    ("capacity", "capacity", "add_capacity", "cmd_capacity"),
    ("replay", "live", "add_replay", "cmd_replay"),
    ("summarize", "live", "add_summarize", "cmd_summarize"),
    ("engines", "live", "add_engines", "cmd_engines"),
    ("serve", "offline", "add_serve", "cmd_serve"),
    ("calibrate", "calibration", "add_calibrate", "cmd_calibrate"),
    ("validate", "calibration", "add_validate", "cmd_validate"),
    ("profiles", "published", "add_profiles", "cmd_profiles"),
    ("check-published", "published", "add_check_published", "cmd_check_published"),
    ("fit-published", "published", "add_fit_published", "cmd_fit_published"),
)
_NAMES = frozenset(name for name, *_ in _COMMANDS)


def build_parser(only: str | None = None
                 ) -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The parser with every command, or with command ``only`` alone (``main``'s fast path:
    only that command's module is imported)."""
    parser = Parser(
        prog="batchlab",
        description="Replay real LLM traffic against continuous-batching engines and compare them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands: dict[str, Command] = {}
    for name, module_name, add, action in _COMMANDS:
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"harness.cli.{module_name}")
        getattr(module, add)(sub)
        commands[name] = getattr(module, action)
    return parser, commands


def _command_parser(parser: argparse.ArgumentParser,
                    args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser that ``args`` were parsed by (``batchlab trace info``:
    ``info``'s), else ``parser``."""
    for dest in ("command", "trace_command"):
        name = getattr(args, dest, None)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not name or not subs or name not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    chosen = args_list[0] if args_list and args_list[0] in _NAMES else None
    parser, commands = build_parser(chosen)
    args, extras = parser.parse_known_args(args_list)
    if extras:  # the command's own usage and hints, not the top level's
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    args.argv = args_list  # what was typed: a command may need to know which flags were given
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    name = " ".join(["batchlab", args.command, *filter(None, [getattr(args, "trace_command",
                                                                       None)])])
    with signals_as_ctrl_c() as received:
        try:
            code = commands[args.command](args)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return code
        except UserError as exc:
            print(f"{name}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as exc:  # its text, when it has one, says what is on disk
            how = f" by {signal.Signals(received[-1]).name}" if received else ""
            said = str(exc) or "results measured so far are on disk"
            print(f"{name}: interrupted{how}; {said}", file=sys.stderr)
            return 128 + (received[-1] if received else signal.SIGINT)
        except BrokenPipeError:
            _quiet_stdout()
            return 128 + signal.SIGPIPE
        except OSError as exc:  # an unwritable --out, a full disk: the file and the reason
            print(f"{name}: error: {_os_error_text(exc)}", file=sys.stderr)
            return EXIT_FAILURE


def run() -> NoReturn:
    """The ``batchlab`` executable: ``main``, then out without tearing the interpreter down
    (module docstring)."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: the normal exit copes with it
        sys.exit(code)
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread()
           for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # what a normal exit would run: the same handlers, in order
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# The same SIGTERM or SIGHUP again within this many seconds is the same request to stop:
# handled twice, the second would interrupt the first's recording of the requests in flight.
REPEAT_WINDOW_S = 1.0


@contextlib.contextmanager
def signals_as_ctrl_c() -> Iterator[list[int]]:
    """While the block runs, SIGTERM and SIGHUP do what Ctrl-C does; yields the signals seen.

    The signal is handed to the current SIGINT handler: inside ``asyncio.run`` that cancels
    the main task (a replay then records what is in flight and writes its summary), elsewhere
    it raises KeyboardInterrupt. Only from the main thread; a signal whose handler is not the
    default (ignored under ``nohup``, or set by an embedding program) is left alone.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    last = [-math.inf]

    def as_ctrl_c(signum: int, frame: Any) -> None:
        now = time.monotonic()
        if received and received[-1] == signum and now - last[0] < REPEAT_WINDOW_S:
            return  # one stop sent twice (`timeout` signals the process, then its group)
        last[0] = now
        received.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored or default at the C level: still stop like Ctrl-C
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, as_ctrl_c) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) == signal.SIG_DFL}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush of a closed pipe is silent."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _os_error_text(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)
