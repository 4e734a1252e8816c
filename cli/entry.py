"""The `onwatch` entry point: parse, run the command, turn every failure into one line and
an exit code."""

from __future__ import annotations

import argparse
import os
import sys

from onwatch.cli.commands.desks import cmd_demo, cmd_tui
from onwatch.cli.output import (
    BAD,
    BUSY,
    NOT_APPLIED,
    OK,
    CliError,
    clip,
    fail,
    terminal_safe_output,
)
from onwatch.cli.parser import build_parser
from onwatch.cli.running import leave_no_thread_behind
from onwatch.core import BadInput, BudgetExceeded, InboxBusy, InboxError, NotAnInbox


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `onwatch` console script; returns the exit code. With `argv`
    None the command line owns the process: it ends even if a thread is left running."""
    code = _main(argv)
    if argv is None:
        leave_no_thread_behind(code)
    return code


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that KEY=VALUE settings may also come after an option
    (`onwatch config URL --inbox a max_batch=1`): argparse ends a list of positionals at
    the first option, and would refuse those as unrecognized. Anything else left over is
    refused as parse_args refuses it."""
    args, extra = parser.parse_known_args(argv)
    settings = getattr(args, "settings", None)
    if extra and isinstance(settings, list) and all(_a_setting(a) for a in extra):
        settings.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _a_setting(argument: str) -> bool:
    return "=" in argument and not argument.startswith("-")


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
        if getattr(args, "handler", None) is None:
            parser.print_help(sys.stderr)
            return BAD
        _check_text_arguments(args)
        if args.handler in (cmd_tui, cmd_demo):  # the app owns the terminal
            return int(args.handler(args) or OK)
        with terminal_safe_output():
            return int(args.handler(args) or OK)
    except SystemExit as exc:  # --help, or argparse's own exit
        return exc.code if exc.code in (OK, NOT_APPLIED, BAD, BUSY) else BAD
    except CliError as exc:
        fail(str(exc))
        return exc.code
    except InboxBusy as exc:
        fail(str(exc))
        return BUSY
    except (BadInput, NotAnInbox) as exc:
        fail(str(exc))
        return BAD
    except BudgetExceeded as exc:
        fail(str(exc))
        return NOT_APPLIED
    except InboxError as exc:
        fail(str(exc))
        return NOT_APPLIED
    except KeyboardInterrupt:
        fail("interrupted")
        return 130
    except BrokenPipeError:
        return OK
    except OSError as exc:
        if exc.filename is None:  # not about a path the caller gave: a bug, below
            return _internal_error(exc)
        fail(f"{exc.strerror or exc}: {clip(os.fsdecode(exc.filename), 200)}")
        return BAD
    except Exception as exc:  # a bug: still one line, the traceback only on request
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    if os.environ.get("ONWATCH_DEBUG"):
        raise exc
    fail(f"internal error: {type(exc).__name__}: {exc} (set ONWATCH_DEBUG=1 for the traceback)")
    return NOT_APPLIED


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse (exit 2) any argument SQLite or the OS cannot take as text: a NUL (possible
    only in-process), or bytes that are not UTF-8 (argv decodes them to lone surrogates)."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            if "\x00" in text:
                raise CliError(f"argument {name}: contains a NUL character")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise CliError(
                    f"argument {name}: is not valid UTF-8 text ({clip(text)!r})"
                ) from None
