"""The engine must stay embeddable: importing core pulls in no UI library."""

import subprocess
import sys


def test_core_imports_no_ui():
    code = ("import sys, core, core.inbox, core.store; "
            "bad = [m for m in ('textual', 'rich') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"core imported UI modules: {result.stdout} {result.stderr}"
