"""Finding an agent (or a setup) by name: 'package.module:function' or 'path/file.py:function'.

The command line loads `--agent` and `--setup` with it, and so does an isolated agent's own
process (core/runtime/child.py), so both find the same function the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import types
from typing import Any, Callable


class LoadError(ValueError):
    """The name does not lead to a function; the message says why, in one line."""


def load(spec: str, what: str) -> Callable[..., Any]:
    """'package.module:function' or 'path/to/file.py:function' → the function. A module is
    looked for in the working directory first, as `python -m` would."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise LoadError(f"{what} must look like module:function, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            module = _load_file(module_name, what)
        else:
            module = importlib.import_module(module_name)
    except LoadError:
        raise
    except FileNotFoundError:
        raise LoadError(f"{what}: no file {module_name}") from None
    except (Exception, SystemExit) as exc:  # sys.exit() at import is a failed import too
        raise LoadError(
            f"{what}: cannot import {module_name}: {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    fn: object = getattr(module, attr, None)
    if not callable(fn):
        raise LoadError(f"{what}: {module_name} has no function {attr!r}")
    return fn


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _load_file(path: str, what: str) -> types.ModuleType:
    """Run a .py file as a module once, registered in sys.modules like any import: an
    agent and its setup from one file share its globals, and @dataclass (which looks its
    module up there) works in it."""
    name = "onwatch_file_" + hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    location = importlib.util.spec_from_file_location(name, path)
    if location is None or location.loader is None:
        raise LoadError(f"{what}: cannot load {path}")
    module = importlib.util.module_from_spec(location)
    sys.modules[name] = module
    try:
        location.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
