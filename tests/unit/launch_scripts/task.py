"""A task for the `hybridpar launch` tests: ``task.py PLAN_JSON RECORD_DIR``.

PLAN maps a task name (``worker:1``), ``<task>@<restart>`` or ``*`` to what the task
does (later keys override earlier ones: ``*``, then the task, then task@restart):

    grandchild: start ``sleep 600`` as a child of this task
    ignore_term: ignore SIGTERM
    bind: bind this task's own TF_CONFIG port (proves it is free and not shared)
    wait_for: task names whose records must exist before going on (at most 20 s), of
        this run (``worker:0``) or of a given restart (``worker:0@1``)
    stdout / stderr: a line to print there; tail: text printed without a newline
    lines: [[stream, text], ...] printed in order (``\x1f`` in text as is)
    progress: N, a Keras-style progress bar of N updates on stdout (``\b...\r`` before each
        update, ``\n`` after the last)
    sleep: seconds to sleep;  kill: SIGKILL itself;  exit: the exit code (default 0)

Before acting, the task writes ``RECORD_DIR/<task>@<restart>.json`` with its pids,
environment (HYBRIDPAR_TEST_MARK, PYTHONUNBUFFERED), working directory and TF_CONFIG,
and prints the same record on stdout.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

plan, record_dir = json.loads(sys.argv[1]), sys.argv[2]
task, restart = os.environ["HYBRIDPAR_TASK"], os.environ["HYBRIDPAR_RESTART"]
spec = {**plan.get("*", {}), **plan.get(task, {}), **plan.get(f"{task}@{restart}", {})}
if spec.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
tf_config = json.loads(os.environ["TF_CONFIG"])
bound = None
if spec.get("bind"):
    address = tf_config["cluster"][tf_config["task"]["type"]][tf_config["task"]["index"]]
    host, _, port = address.rpartition(":")
    bound = socket.socket()
    bound.bind((host, int(port)))
pids = [os.getpid()]
if spec.get("grandchild"):
    pids.append(subprocess.Popen(["sleep", "600"]).pid)
record = {
    "task": task,
    "restart": int(restart),
    "pids": pids,
    "tf_config": tf_config,
    "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
    "mark": os.environ.get("HYBRIDPAR_TEST_MARK"),
    "cwd": os.getcwd(),
}
tmp = os.path.join(record_dir, f".{task}@{restart}.tmp")
with open(tmp, "w") as f:
    json.dump(record, f)
os.rename(tmp, os.path.join(record_dir, f"{task}@{restart}.json"))
print("record", json.dumps(record))
end = time.monotonic() + 20
for other in spec.get("wait_for", []):
    name = other if "@" in other else f"{other}@{restart}"
    while not os.path.exists(os.path.join(record_dir, f"{name}.json")):
        if time.monotonic() > end:
            sys.exit(f"{task}: gave up waiting for {other}")
        time.sleep(0.02)
if "stdout" in spec:
    print(spec["stdout"])
if "stderr" in spec:
    print(spec["stderr"], file=sys.stderr)
for stream, text in spec.get("lines", []):
    print(text, file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)
if spec.get("progress"):
    steps, width = spec["progress"], 0
    for step in range(1, steps + 1):
        bar = f"\x1b[1m{step}/{steps}\x1b[0m " + "━" * step + f" - loss: {1 / step:.4f}"
        sys.stdout.write("\b" * width + "\r" + bar + ("\n" if step == steps else ""))
        sys.stdout.flush()
        width = len(bar)
        time.sleep(0.01)
if "tail" in spec:
    sys.stdout.write(spec["tail"])
    sys.stdout.flush()
time.sleep(spec.get("sleep", 0))
if spec.get("kill"):
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(spec.get("exit", 0))
