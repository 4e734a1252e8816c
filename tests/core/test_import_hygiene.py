"""What a fresh interpreter holds after `import onwatch`: the one rule import-linter cannot see.

The layers themselves (core imports no UI, the desk reaches the database only through core)
are import-linter contracts in pyproject.toml, checked by tests/core/test_layers.py. Those
read the source, so they count an import inside a function as an import; they cannot say
that a dependency of core pulls in a UI library, or that an import stays lazy until used.
"""

import subprocess
import sys


def test_import_core_loads_no_ui_and_no_receiver():
    """The engine embeds in an agent: `import onwatch` must not load a terminal UI, and the
    webhook receiver (with aiohttp) loads only when a server starts."""
    code = (
        "import sys, onwatch, onwatch.core.inbox, onwatch.core.engine.runs, "
        "onwatch.core.webhooks.signatures, onwatch.core.webhooks.config; "
        "bad = [m for m in ('textual', 'rich', 'aiohttp', 'onwatch.core.webhooks.server') "
        "if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"loaded: {result.stdout} {result.stderr}"


def test_import_core_alone_does_not_load_the_receiver_package():
    code = "import sys, onwatch; sys.exit(1 if 'onwatch.core.webhooks' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
