"""The `hybridpar` command's argument handling and its bad-input errors.

The error cases run the real console script in a subprocess; they fail
before TensorFlow is imported, so they stay fast.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from hybridpar import ConfigError
from hybridpar.cli.train_command import load_config, parse_overrides

ROOT = pathlib.Path(__file__).resolve().parents[2]
HYBRIDPAR = [sys.executable, "-m", "hybridpar.cli"]


def run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    return subprocess.run([*HYBRIDPAR, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_overrides_are_parsed_as_yaml():
    assert parse_overrides(["data.global_batch_size=256", "data_parallel.devices=[/cpu:0, /cpu:1]",
                            "checkpoint.dir=null", "train.data_dir="]) == {
        "data.global_batch_size": 256,
        "data_parallel.devices": ["/cpu:0", "/cpu:1"],
        "checkpoint.dir": None,
        "train.data_dir": None,
    }


@pytest.mark.parametrize("item", ["data.global_batch_size", "=3"])
def test_override_without_key_value_is_refused(item):
    with pytest.raises(ConfigError, match="--set expects key=value"):
        parse_overrides([item])


def test_data_dir_flag_overrides_the_config():
    config = load_config(str(ROOT / "configs" / "quickstart.yaml"), [], "/data/tfds")
    assert config.train.data_dir == "/data/tfds"


def test_set_with_unknown_key_gets_did_you_mean():
    result = run("train", "--config", "configs/quickstart.yaml", "--set", "data.global_bach_size=8")
    assert result.returncode == 2
    assert 'Unknown config key "data.global_bach_size". Did you mean "data.global_batch_size"?' \
        in result.stderr
    assert "Traceback" not in result.stderr


def test_yaml_that_does_not_parse_names_file_and_line(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("data:\n  global_batch_size: 64\n   mode: x\n")
    result = run("train", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}:3:" in result.stderr and "YAML does not parse" in result.stderr


def test_missing_config_file_is_named(tmp_path):
    result = run("train", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "Cannot read config file" in result.stderr and "nope.yaml" in result.stderr


def test_unknown_command_gets_did_you_mean():
    result = run("trian")
    assert result.returncode == 2
    assert "unknown command 'trian'. Did you mean \"train\"?" in result.stderr


def test_help_lists_the_commands():
    result = run("--help")
    assert result.returncode == 0 and "train" in result.stdout


def test_train_help_lists_the_train_flags():
    result = run("train", "--help")  # absl alone printed only "Try --helpfull"
    assert result.returncode == 0
    for flag in ("--config", "--set", "--model_dir", "--data_dir", "--logical_cpus"):
        assert flag in result.stdout


@pytest.mark.parametrize("value", ["abc", "0"])
def test_bad_hybridpar_logical_cpus_fails_at_import(value):
    env = {**os.environ, "HYBRIDPAR_LOGICAL_CPUS": value}
    env.pop("TF_CONFIG", None)
    result = subprocess.run([sys.executable, "-c", "import hybridpar"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert f"HYBRIDPAR_LOGICAL_CPUS must be a positive integer. Received: '{value}'." in (
        result.stderr)
