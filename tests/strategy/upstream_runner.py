"""Runs one case of an upstream-reproduction script in a fresh process."""

import json
import pathlib
import subprocess
import sys


def run_case(script: pathlib.Path, case: str) -> dict:
    """The JSON line ``python script case`` printed last (a fresh process, so no
    hybridpar fix is installed)."""
    completed = subprocess.run(
        [sys.executable, str(script), case], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])
