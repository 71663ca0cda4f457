"""The `etweave` command line: one subcommand per module in `etweave.commands`.

Exit codes, for every command: 0 ok, 1 internal error, 2 bad input, 3 a check or consistency violation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

import etweave
from etweave import progress
from etweave.commands import COMMAND_MODULES, command_module
from etweave.errors import BadInput, CheckFailed
from etweave.nogc import no_gc
from etweave.version import __version__

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_CHECK = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse, plus "did you mean" for a mistyped subcommand, option or choice."""

    option_pool: list[str] = []  # noqa: RUF012 (set per parse in main: the options of the subcommand given)

    def error(self, message: str) -> NoReturn:
        super().error(message + _suggestion(message, self.option_pool or list(self._option_string_actions)))


def _suggestion(message: str, options: list[str]) -> str:
    import difflib  # only for a command line argparse refused

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1)
        return f"; did you mean '{close[0]}'?" if close else ""
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    if unknown:
        for word in unknown[1].split():
            close = difflib.get_close_matches(word.split("=")[0], options, n=1) if word.startswith("-") else []
            if close:
                return f"; did you mean {close[0]} (for {word})?"
    return ""


def _add_common_options(p: argparse.ArgumentParser) -> None:
    """Options every subcommand takes, also after its name (a command that defines one itself keeps its own)."""
    have = p._option_string_actions
    if "--debug" not in have:
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an internal error")
    if "--quiet" not in have:
        p.add_argument("-q", "--quiet", action="store_true", help="no progress on the terminal")
    if "--verbose" not in have:
        p.add_argument("-v", "--verbose", action="store_true",
                       help="after each stage, print its name and time on stderr (also when piped)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `only`, that command's alone is built (and its module imported), the
    others are bare names: parsing a command line of `only` gives the same result."""
    parser = _Parser(
        prog="etweave", description=etweave.__doc__,
        epilog="Exit codes: 0 ok, 1 internal error (--debug shows the traceback), 2 bad input (one line on stderr), "
               "3 a check or consistency violation. Start with: etweave example")
    parser.add_argument("--version", action="version", version=f"etweave {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        if only is None or name == only:
            command_module(name).register(sub)
        else:
            sub.add_parser(name)
    for p in sub.choices.values():
        _add_common_options(p)
    return parser


# Options whose value may start with "-" (a window from a negative time): argparse would take "-100:200" for an
# option, so such a value is glued to its option ("--window=-100:200") before parsing.
_DASH_VALUES = ("--window", "--steps")


def _glue_dash_values(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] in _DASH_VALUES and i + 1 < len(args) and args[i + 1].startswith("-") and args[i + 1] != "--":
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _command_word(words: Sequence[str]) -> str | None:
    """The command named on the line, when only its parser is needed: not when the top-level help comes first."""
    for w in words:
        if w in COMMAND_MODULES:
            return w
        if w in ("-h", "--help"):
            return None
    return None


# Commands that, run as a process (the command line, not `main(argv)`), exit without the interpreter's teardown:
# their outputs are written, closed and renamed into place when they return, and freeing every object of a large
# trace one by one on the way out costs more than some of their stages.
_QUICK_EXIT = frozenset({"convert", "simulate"})


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    if argv is None and _command_word(sys.argv[1:]) in _QUICK_EXIT:
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """Flush what was printed and end the process here."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    words = _glue_dash_values(sys.argv[1:] if argv is None else argv)
    only = _command_word(words)
    with no_gc():  # importing the command's modules builds thousands of objects and no garbage
        parser = build_parser(only)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = next((w for w in words if w in subparsers), None)
    if command is not None:
        _Parser.option_pool = list(subparsers[command]._option_string_actions)
    args = parser.parse_args(words)
    progress.configure(not getattr(args, "quiet", False), verbose=getattr(args, "verbose", False))
    try:
        return int(args.run(args))
    except BadInput as exc:
        print(f"etweave: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CheckFailed as exc:
        print(f"etweave: check failed: {exc}", file=sys.stderr)
        return EXIT_CHECK
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (so that the interpreter's final flush is quiet)
        return EXIT_OK
    except MemoryError:  # a resource limit, not a bug: the input is too large for what this process may use
        print("etweave: error: out of memory: the input is too large for the memory (or address-space limit) "
              "available; ETWEAVE_MAX_INPUT_BYTES refuses such inputs earlier", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("etweave: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an etweave bug, not the user's input
        if args.debug:
            import traceback  # only for an internal error

            traceback.print_exc()
        print(f"etweave: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
