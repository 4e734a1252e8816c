"""The `onwatch` command line: scripts and operators act on an inbox from a shell.

Exit codes (every subcommand):
  0  done (an ingest that was a duplicate is still 0: the event is stored exactly once)
  1  the action was not applied or was refused (state changed meanwhile, budget, answer
     already stands, delivery failed)
  2  bad usage, bad input, or the file is not an onwatch inbox
  3  the inbox stayed locked by another process for longer than the busy timeout

Errors go to stderr as one line starting with "onwatch: ". Textual is imported only by
`onwatch tui`, `onwatch demo` and `onwatch web` (cli/commands/desks.py), so every other
subcommand starts fast and runs where no terminal UI is installed.

Layout: parser.py builds the argument parser; commands/ holds the commands grouped by what
they act on; output.py, values.py and running.py are what the commands share.
"""

from onwatch.cli.entry import main

__all__ = ["main"]
