"""What a person sees under `hybridpar launch`: pure line handling, then real child processes.

The real-process tests run tests/unit/launch_scripts/task.py tasks that print a
Keras-style progress bar (``\\b...\\r`` before each update), tagged hybridpar log
lines, warnings and tracebacks, and check the console and the per-task log files.
"""

import io
import os
import subprocess
import sys

from launch_helpers import run_launch

from hybridpar import logs
from hybridpar.launch import output
from hybridpar.launch.output import Console, Sieve, Splitter, TaskOutput
from hybridpar.topology.cluster import Task

TAG = logs.LOG_TAG


def keras_bar(steps: int) -> bytes:
    """What Keras's Progbar writes on a dynamic display for one epoch."""
    text, width = "", 0
    for step in range(1, steps + 1):
        bar = f"\x1b[1m{step}/{steps}\x1b[0m loss: {1 / step:.3f}"
        text += "\b" * width + "\r" + bar + ("\n" if step == steps else "")
        width = len(bar)
    return text.encode()


# --------------------------------------------------------------------------- pure logic


def test_splitter_turns_a_progress_bar_into_updates_and_one_line():
    events = Splitter().feed(keras_bar(3))
    assert [kind for kind, _ in events] == ["update", "update", "line"]
    assert events[-1][1] == "\x1b[1m3/3\x1b[0m loss: 0.333"
    assert "\b" not in "".join(text for _, text in events)


def test_splitter_joins_chunks_cut_anywhere():
    data = b"first\r\nsec" + "ønd\n".encode() + keras_bar(2) + b"last, no newline"
    whole = Splitter()
    expected = whole.feed(data) + whole.close()
    for size in (1, 2, 3, 7):
        splitter, events = Splitter(), []
        for start in range(0, len(data), size):
            events += splitter.feed(data[start : start + size])
        assert events + splitter.close() == expected
    assert [text for kind, text in expected if kind == "line"] == [
        "first", "secønd", "\x1b[1m2/2\x1b[0m loss: 0.500", "last, no newline"]


def test_untag_reads_the_level_of_hybridpar_lines():
    assert output.untag(f"{TAG}WARNING{TAG}hybridpar: careful") == ("WARNING", "hybridpar: careful")
    assert output.untag("plain line") == (None, "plain line")


def test_sieve_keeps_warnings_errors_and_whole_tracebacks():
    sieve = Sieve()
    kept = [line for stream, level, line in [
        ("stderr", "INFO", "hybridpar: joined cluster as worker:1"),
        ("stderr", "WARNING", "hybridpar: checkpoint ckpt-1 is damaged"),
        ("stderr", None, "I0000 00:00:1.0 port.cc:153] oneDNN custom operations are on."),
        ("stderr", None, "W0000 00:00:1.0 grpc_server.cc:1] something odd"),
        ("stderr", None, "/x.py:3: UserWarning: shuffle is ignored"),
        ("stdout", None, "8/8 - 1s - loss: 0.3 - mean_absolute_error: 0.2"),
        ("stdout", None, "Traceback (most recent call last):"),
        ("stdout", None, '  File "train.py", line 3, in <module>'),
        ("stdout", None, ""),
        ("stdout", None, "ValueError: bad"),
        ("stdout", None, "after the traceback"),
    ] if sieve.keep(stream, level, line)]
    assert kept == [
        "hybridpar: checkpoint ckpt-1 is damaged",
        "W0000 00:00:1.0 grpc_server.cc:1] something odd",
        "/x.py:3: UserWarning: shuffle is ignored",
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "",
        "ValueError: bad",
    ]


def test_shown_task_is_the_chief_else_worker_0():
    assert output.shown_task([Task("worker", 0), Task("worker", 1)]) == Task("worker", 0)
    assert output.shown_task([Task("chief", 0), Task("worker", 0), Task("ps", 0)]) == Task(
        "chief", 0)


def test_on_a_terminal_updates_redraw_one_live_line(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, err, live=True)
    chief = TaskOutput(Task("worker", 0), console, tmp_path / "worker-0.log", whole=True)
    other = TaskOutput(Task("worker", 1), console, None, whole=False)
    data = keras_bar(3)
    chief.feed("stdout", data[: data.index(b"2/3")])
    other.feed("stderr", f"{TAG}WARNING{TAG}hybridpar: slow\n".encode())
    chief.feed("stdout", data[data.index(b"2/3") :])
    chief.close()
    other.close()
    text = out.getvalue()
    assert text.count("\r[worker:0] \x1b[1m1/3") == 1  # drawn once, then redrawn around err
    assert text.endswith("\r\x1b[K[worker:0] \x1b[1m3/3\x1b[0m loss: 0.333\n")
    assert err.getvalue() == "[worker:1] hybridpar: slow\n"
    log = (tmp_path / "worker-0.log").read_text().splitlines()
    assert log[0].startswith("===== hybridpar launch: worker:0 started at ")
    assert log[1:] == ["3/3 loss: 0.333"]  # escapes stripped, updates left out


def test_off_a_terminal_an_epoch_is_one_line_and_a_dying_bar_is_kept_in_the_log(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, err, live=False)
    chief = TaskOutput(Task("worker", 0), console, tmp_path / "w.log", whole=True)
    second = keras_bar(4)
    chief.feed("stdout", keras_bar(4) + second[: second.index(b"\x1b[1m3/4")])  # dies in 2/4
    chief.close()
    assert out.getvalue() == "[worker:0] 4/4 loss: 0.250\n"
    assert (tmp_path / "w.log").read_text().splitlines()[1:] == [
        "4/4 loss: 0.250", "2/4 loss: 0.500"]


def test_log_tags_are_added_only_under_the_launcher():
    code = ("import logging, hybridpar; hybridpar.log_to_stderr(); "
            "logging.getLogger('hybridpar').warning('hybridpar: w'); "
            "logging.getLogger('hybridpar').info('hybridpar: i')")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", logs.LOG_TAGS_ENV)}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60)
    tagged = subprocess.run([sys.executable, "-c", code], env={**env, logs.LOG_TAGS_ENV: "1"},
                            capture_output=True, text=True, timeout=60)
    assert plain.stderr.splitlines() == ["hybridpar: w", "hybridpar: i"]
    assert tagged.stderr.splitlines() == [f"{TAG}WARNING{TAG}hybridpar: w",
                                          f"{TAG}INFO{TAG}hybridpar: i"]


# --------------------------------------------------------------------------- real children


def test_default_console_shows_the_chief_and_the_others_warnings_and_errors(tmp_path, records):
    lines = [["stderr", f"{TAG}INFO{TAG}hybridpar: joined cluster"],
             ["stderr", f"{TAG}WARNING{TAG}hybridpar: checkpoint damaged"],
             ["stdout", "a plain print"],
             ["stderr", "/x.py:1: UserWarning: careful"]]
    plan = {"*": {"lines": lines, "progress": 30}}
    logs_dir = tmp_path / "logs"
    result, _ = run_launch(["--workers", "2", "--log-dir", str(logs_dir)], plan, records)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout.splitlines(), result.stderr.splitlines()
    assert "[worker:0] a plain print" in out and "[worker:1] a plain print" not in out
    assert out.count("[worker:0] 30/30 " + "━" * 30 + " - loss: 0.0333") == 1
    assert not any(line.startswith("[worker:1]") for line in out)
    assert max(len(line) for line in out) < 300  # no epoch glued into one huge line
    assert "\r" not in result.stdout and "\b" not in result.stdout
    assert "[worker:0] hybridpar: joined cluster" in err
    assert "[worker:1] hybridpar: joined cluster" not in err
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] hybridpar: checkpoint damaged" in err
        assert f"[{task}] /x.py:1: UserWarning: careful" in err
    assert f"hybridpar launch: every task's full log is in {logs_dir}/ (<type>-<index>.log)" \
        in err
    for name in ("worker-0", "worker-1"):
        log = (logs_dir / f"{name}.log").read_text()
        assert "hybridpar: joined cluster\n" in log and "a plain print\n" in log
        assert "30/30 " in log and "3/30 " not in log and TAG not in log


def test_a_failed_task_that_was_not_shown_gets_its_last_lines_printed(tmp_path, records):
    plan = {"worker:0": {"sleep": 30},
            "worker:1": {"lines": [["stdout", f"line {i}"] for i in range(30)], "exit": 3}}
    result, _ = run_launch(["--workers", "2", "--log-dir", str(tmp_path / "l")], plan,
                           records)
    assert result.returncode == 3
    err = result.stderr.splitlines()
    header = [i for i, line in enumerate(err) if "last 20 line(s) of worker:1" in line]
    assert header and f"(full log: {tmp_path / 'l' / 'worker-1.log'})" in err[header[0]]
    assert err[header[0] + 1 : header[0] + 21] == [f"[worker:1] line {i}" for i in range(10, 30)]
    assert (tmp_path / "l" / "worker-1.log").read_text().count("line ") == 30


def test_restarts_append_to_the_task_logs(tmp_path, records):
    plan = {"worker:1@0": {"stdout": "first run", "exit": 5}, "*": {"stdout": "hello"}}
    result, _ = run_launch(["--workers", "2", "--max-restarts", "1", "--log-dir",
                            str(tmp_path / "l")], plan, records)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "l" / "worker-1.log").read_text()
    assert log.count("===== hybridpar launch: worker:1 started") == 2
    assert "(restart 1) =====" in log and "first run" in log
