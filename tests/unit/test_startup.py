"""``hybridpar.initialize()`` and what ``import hybridpar`` does at start-up."""

import json
import os
import subprocess
import sys

import pytest

import hybridpar
from hybridpar import ConfigError, startup
from hybridpar.topology.cluster import parse_tf_config

TWO_WORKERS = {"worker": ["localhost:1", "localhost:2"]}


def tf_config(cluster: dict, task: str, index: int = 0) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task, "index": index}})


def run_python(code: str, **environ: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "HYBRIDPAR_LOGICAL_CPUS") and not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, **environ}, timeout=120)


@pytest.mark.parametrize("environ, expected", [({}, None), ({"HYBRIDPAR_LOGICAL_CPUS": ""}, None),
                                               ({"HYBRIDPAR_LOGICAL_CPUS": "3"}, 3)])
def test_logical_cpus_from_env(environ, expected):
    assert startup.logical_cpus_from_env(environ) == expected


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_bad_logical_cpus_variable_is_refused(value):
    with pytest.raises(ConfigError, match=rf"HYBRIDPAR_LOGICAL_CPUS must be a positive "
                                          rf"integer\. Received: '{value}'\."):
        startup.logical_cpus_from_env({"HYBRIDPAR_LOGICAL_CPUS": value})


@pytest.mark.parametrize("cluster, task, joins", [
    (TWO_WORKERS, "worker", True),
    ({"chief": ["h:0"], "worker": ["h:1"]}, "chief", True),
    ({"chief": ["h:0"], "worker": ["h:1"], "evaluator": ["h:2"]}, "evaluator", False),
    ({"worker": ["h:1"]}, "worker", False),  # one worker: nothing to all-reduce with
    ({"chief": ["h:0"], "worker": ["h:1"], "ps": ["h:2"]}, "worker", False),
    ({"chief": ["h:0"], "worker": ["h:1"], "ps": ["h:2"]}, "ps", False),
])
def test_which_tasks_join_at_startup(cluster, task, joins):
    assert parse_tf_config(tf_config(cluster, task)).runs_collectives is joins


def test_import_initializes_only_where_the_environment_names_a_cluster(monkeypatch):
    calls = []
    monkeypatch.setattr(startup, "initialize", lambda: calls.append("initialize"))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("HYBRIDPAR_LOGICAL_CPUS", "2")
    startup.initialize_if_asked()
    assert calls == []  # a plain process (or the launcher) is left alone
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["h:1"]}, "worker"))
    startup.initialize_if_asked()
    assert calls == ["initialize"]


def test_initialize_is_exported_and_returns_the_cluster(monkeypatch):
    assert "initialize" in hybridpar.__all__ and hybridpar.initialize is startup.initialize
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    assert hybridpar.initialize() is None
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["h:1"]}, "worker"))
    assert hybridpar.initialize().task_type == "worker"  # one worker: nothing joined


def test_import_alone_starts_no_tensorflow_and_initialize_splits_the_cpu():
    code = ("import sys, hybridpar\n"
            "print('tensorflow' in sys.modules)\n"
            "hybridpar.initialize()\n"
            "hybridpar.initialize()  # again: nothing more\n"
            "import tensorflow as tf\n"
            "print(len(tf.config.list_logical_devices('CPU')))\n")
    result = run_python(code, HYBRIDPAR_LOGICAL_CPUS="3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "3"]


def test_initialize_takes_the_number_of_logical_cpus():
    code = ("import hybridpar, tensorflow as tf\n"
            "hybridpar.initialize(logical_cpus=2)\n"
            "print(len(tf.config.list_logical_devices('CPU')))\n")
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["2"]


def test_an_op_before_import_cannot_join_the_cluster_and_says_so():
    code = "import tensorflow as tf\ntf.constant(1.0) + 1\nimport hybridpar\n"
    result = run_python(code, TF_CONFIG=tf_config(TWO_WORKERS, "worker"))
    assert result.returncode != 0
    assert ("ConfigError: TensorFlow already ran an op in this process, so it cannot join the "
            "multi-worker cluster in TF_CONFIG any more" in result.stderr), result.stderr[-3000:]
    assert "put `import hybridpar` above the first TensorFlow op" in result.stderr
