"""onwatch: a durable inbox and a supervision desk for always-on AI agents.

What an agent embeds is the engine, re-exported here (`from onwatch import Inbox`); the
subpackages are `onwatch.core` (the engine), `onwatch.tui` (the desk) and `onwatch.cli`
(the `onwatch` command). In the repository they are the folders core/, tui/ and cli/ at the
top, linked into this package.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from .core import *  # noqa: F403 - the engine's public names are the package's
from .core import __all__ as _engine_names

try:
    __version__ = _version("onwatch")
except PackageNotFoundError:  # pragma: no cover - a source tree without an install
    __version__ = "0+unknown"

__all__ = [*_engine_names, "__version__"]
