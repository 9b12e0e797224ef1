"""Every preset in configs/ runs through the real `hybridpar train` command."""

import json
import os
import pathlib
import subprocess
import sys

import hybridpar_models  # noqa: F401 (registers the custom layers saved models use)
import keras
import pytest
import yaml

pytestmark = [pytest.mark.strategy, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))
CLUSTER_MODES = ("multi_worker", "parameter_server")  # run through `hybridpar launch`
LOCAL_PRESETS = [
    p for p in PRESETS
    if (yaml.safe_load(p.read_text()).get("data_parallel") or {}).get("mode") not in CLUSTER_MODES
]
HYBRIDPAR = pathlib.Path(sys.executable).with_name("hybridpar")


def hybridpar_train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run([str(HYBRIDPAR), "train", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


def test_presets_exist():
    assert {p.name for p in PRESETS} >= {"quickstart.yaml", "mirrored.yaml"}


@pytest.mark.parametrize("preset", LOCAL_PRESETS, ids=[p.stem for p in LOCAL_PRESETS])
def test_preset_trains(preset, tmp_path, digits_data_dir):
    settings = yaml.safe_load(preset.read_text())
    overrides = ["--set", "train.epochs=2"]
    if (settings.get("checkpoint") or {}).get("dir"):
        overrides += ["--set", f"checkpoint.dir={tmp_path / 'checkpoints'}"]
    model_dir = tmp_path / "run"
    result = hybridpar_train("--config", str(preset), "--model_dir", str(model_dir),
                             "--data_dir", digits_data_dir, "--logical_cpus", "4",
                             "--verbose", "2", *overrides)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert out.count("examples_per_sec:") == 2  # one line per epoch, with the rate
    assert "hybridpar training summary" in out and "examples/s" in out
    summary = json.loads((model_dir / "summary.json").read_text())
    stages = (settings.get("model_parallel") or {}).get("stages", 1)
    assert summary["mode"] == "mirrored" and summary["num_replicas"] == 4 // stages
    assert summary["stages"] == stages
    assert (model_dir / "placement.png").read_bytes()[:4] == b"\x89PNG"
    assert f"x {stages} stage(s)" in (model_dir / "placement.txt").read_text()
    if (settings.get("train") or {}).get("timeline_steps"):
        trace = json.loads((model_dir / "timeline.trace.json").read_text())
        assert any(e["ph"] == "X" for e in trace["traceEvents"])
        assert (model_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    compression = (settings.get("communication") or {}).get("compression", "none")
    if compression == "none":
        assert summary["compression"] == "none"
    else:
        assert summary["compression"].startswith(f"gradient compression {compression}")
        assert f"compression       {summary['compression']}" in out
        assert result.stderr.count(summary["compression"]) == 1  # the run log says it once
    assert summary["train_metrics"]["accuracy"] > 0.3
    assert list((model_dir / "logs" / "train").glob("events.out.tfevents.*"))
    reloaded = keras.models.load_model(model_dir / "model.keras")
    assert reloaded.output_shape == (None, 10)


def test_absent_tfds_dataset_says_how_to_prepare_it(tmp_path):
    result = hybridpar_train("--config", "configs/quickstart.yaml", "--data_dir", str(tmp_path),
                             "--set", "train.dataset=mnist", "--model_dir", str(tmp_path / "m"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "'mnist'" in result.stderr and str(tmp_path) in result.stderr
    assert "tfds build mnist" in result.stderr and "Traceback" not in result.stderr


def test_missing_device_lists_the_real_ones(tmp_path, digits_data_dir):
    result = hybridpar_train("--config", "configs/mirrored.yaml", "--logical_cpus", "2",
                             "--data_dir", digits_data_dir, "--model_dir", str(tmp_path),
                             "--set", "data_parallel.devices=[/cpu:0, /cpu:5]")
    assert result.returncode == 2
    assert ("/device:CPU:5, which this process does not have. Devices that exist: "
            "/device:CPU:0, /device:CPU:1") in result.stderr
