"""Helpers of the tests that run `hybridpar launch` (unit, multiworker and ray layers).

The unit and Ray-engine tests launch the small tasks of unit/launch_scripts/task.py;
every task records its pids, environment and TF_CONFIG, so the tests can check by pid
that nothing survives the launcher. The multi-worker tests read every task's lines,
so ``launch_command`` shows every task whole (``--console all``) and sends the
per-task logs to one temporary directory per test process, not ``runs/launch/``.
"""

import atexit
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TASK_SCRIPT = pathlib.Path(__file__).parent / "unit" / "launch_scripts" / "task.py"
LAUNCH = [sys.executable, "-m", "hybridpar.launch"]
LOG_DIR = tempfile.mkdtemp(prefix="hybridpar-test-launch-logs-")
atexit.register(shutil.rmtree, LOG_DIR, ignore_errors=True)


def launch_command(*flags: str, console: str = "all") -> list[str]:
    """``python -m hybridpar.launch --console all --log-dir <tmp> FLAGS...``."""
    return [*LAUNCH, "--console", console, "--log-dir", LOG_DIR, *flags]


# --------------------------------------------------------------------------- helpers


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("TF_CONFIG", "HYBRIDPAR_TASK", "HYBRIDPAR_RESTART"):
        env.pop(name, None)
    return env


def _command(plan: dict, records: pathlib.Path) -> list[str]:
    return [sys.executable, str(TASK_SCRIPT), json.dumps(plan), str(records)]


def run_launch(flags: list[str], plan: dict, records: pathlib.Path, timeout: float = 40):
    """Runs the launcher to completion; returns (CompletedProcess, elapsed seconds).

    Task logs go to ``records/../logs`` unless ``flags`` name a ``--log-dir``.
    """
    start = time.monotonic()
    if "--log-dir" not in flags:
        flags = [*flags, "--log-dir", str(records.parent / "logs")]
    result = subprocess.run([*LAUNCH, *flags, "--", *_command(plan, records)],
                            capture_output=True, text=True, env=_env(), timeout=timeout)
    return result, time.monotonic() - start


def records_of(records: pathlib.Path) -> dict[str, dict]:
    """``worker:1@0`` -> the record that task wrote."""
    return {p.stem: json.loads(p.read_text()) for p in records.glob("*.json")}


def wait_for_records(records: pathlib.Path, names: list[str], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not all((records / f"{name}.json").exists() for name in names):
        assert time.monotonic() < end, f"not started: {names}; have {list(records_of(records))}"
        time.sleep(0.02)


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for init to reap it counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def all_pids(records: pathlib.Path) -> list[int]:
    return [pid for record in records_of(records).values() for pid in record["pids"]]


def assert_no_survivors(records: pathlib.Path) -> None:
    pids = all_pids(records)
    assert pids, "no task recorded its pid"
    survivors = [pid for pid in pids if is_alive(pid)]
    for pid in survivors:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes survived the launcher: {survivors}"
