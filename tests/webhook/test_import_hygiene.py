"""`import core` stays light: the receiver's aiohttp loads only when a server starts."""

import subprocess
import sys


def test_core_and_the_signature_checks_do_not_import_aiohttp():
    code = ("import sys, core, core.webhooks, core.webhooks.signatures, core.webhooks.config; "
            "bad = [m for m in ('aiohttp', 'textual', 'rich') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"imported: {result.stdout} {result.stderr}"


def test_core_does_not_import_the_receiver():
    code = "import sys, core; sys.exit(1 if 'core.webhooks' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
