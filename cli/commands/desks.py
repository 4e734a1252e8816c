"""Commands that draw: tui, demo and web. Textual is imported here only when one of them
runs, so every other command starts without it."""

from __future__ import annotations

import argparse
import os

from onwatch.cli import running
from onwatch.cli.output import OK, CliError
from onwatch.cli.values import actor_of


def cmd_tui(args: argparse.Namespace) -> int:
    actor = actor_of(args)  # who the desk's actions are audited as; refused before it draws
    url = args.path.startswith(("postgresql://", "postgres://"))
    if os.path.isdir(args.path) or (url and args.inbox is None):  # the fleet desk
        app = running.lazy("onwatch.tui.app", "the fleet desk")
        return app.run_fleet(args.path, read_only=args.read_only, actor=actor) or OK
    if url or args.inbox is not None:  # one inbox of a database (a file refuses --inbox)
        app = running.lazy("onwatch.tui.app", "the TUI")
        return app.run(args.path, read_only=args.read_only, name=args.inbox, actor=actor) or OK
    if not os.path.exists(args.path):
        raise CliError(f"no inbox at {args.path} (run `onwatch init {args.path}` first)")
    app = running.lazy("onwatch.tui.app", "the TUI")
    return app.run(args.path, read_only=args.read_only, actor=actor) or OK


def cmd_demo(args: argparse.Namespace) -> int:
    demo = running.lazy("onwatch.tui.demo", "the demo")
    return demo.run(live=args.live) or OK


def cmd_web(args: argparse.Namespace) -> int:
    web = running.lazy("onwatch.tui.web", "the browser desk")
    return web.main(args) or OK
