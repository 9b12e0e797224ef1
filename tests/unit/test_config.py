"""StrategyConfig parsing and validation (pure Python, no TensorFlow)."""

import textwrap

import pytest

from hybridpar import ConfigError, StrategyConfig
from hybridpar.config import DataConfig, PartitionerConfig


def test_defaults_follow_the_contract():
    config = StrategyConfig()
    assert config.data_parallel.mode == "auto"
    assert config.data_parallel.devices is None
    assert config.model_parallel.stages == 1
    assert config.model_parallel.placement == {}
    assert config.model_parallel.microbatches == 1
    assert config.data.global_batch_size is None
    assert config.data.shard_policy == "auto"
    assert config.checkpoint.every_epochs == 1 and config.checkpoint.keep == 3
    assert config.checkpoint.backup_and_restore is True
    assert config.parameter_server.partitioner is None
    assert config.communication.implementation == "auto"
    assert config.communication.compression == "none"


def test_yaml_round_trip(tmp_path):
    config = StrategyConfig.from_dict(
        {
            "data_parallel": {"mode": "mirrored", "devices": ["/gpu:0", "GPU:1"]},
            "model_parallel": {"placement": {"dense": 0}},
            "data": {"global_batch_size": 64, "shard_policy": "file"},
            "parameter_server": {"partitioner": None},
            "checkpoint": {"dir": "/tmp/ckpt", "every_steps": 100, "keep": 5},
            "communication": {"implementation": "ring", "timeout_seconds": 30},
        }
    )
    path = tmp_path / "c.yaml"
    path.write_text(config.to_yaml())
    again = StrategyConfig.from_yaml(path)
    assert again == config
    assert again.to_dict() == config.to_dict()
    assert again.data_parallel.devices == ("/device:GPU:0", "/device:GPU:1")
    assert again.communication.timeout_seconds == 30.0


def test_partitioner_round_trip():
    config = StrategyConfig.from_dict(
        {
            "data_parallel": {"mode": "parameter_server"},
            "parameter_server": {"partitioner": {"kind": "min_size", "max_shards": 4,
                                                 "min_shard_bytes": 1024}},
        }
    )
    assert config.parameter_server.partitioner == PartitionerConfig(
        kind="min_size", min_shard_bytes=1024, max_shards=4
    )
    assert StrategyConfig.from_dict(config.to_dict()) == config


def test_override_dotted_keys_returns_a_new_config():
    base = StrategyConfig()
    changed = base.override({"data.global_batch_size": 256, "data_parallel.mode": "mirrored"})
    assert changed.data.global_batch_size == 256
    assert changed.data_parallel.mode == "mirrored"
    assert base.data.global_batch_size is None


def test_override_with_a_section_mapping_merges():
    base = StrategyConfig().override({"data.shard_policy": "file"})
    changed = base.override({"data": {"global_batch_size": 8}})
    assert changed.data == DataConfig(global_batch_size=8, shard_policy="file")


def test_config_is_immutable():
    with pytest.raises(AttributeError):
        StrategyConfig().data.global_batch_size = 3  # type: ignore[misc]


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "data, match",
    [
        ({"data": {"global_batchsize": 3}}, 'Unknown config key "data.global_batchsize". '
         'Did you mean "data.global_batch_size"'),
        ({"dataparallel": {}}, 'Unknown config key "dataparallel". Did you mean "data_parallel"'),
        ({"checkpoint": {"evry_steps": 1}}, 'Did you mean "checkpoint.every_steps"'),
    ],
)
def test_unknown_keys_get_did_you_mean(data, match):
    with pytest.raises(ConfigError, match=match):
        StrategyConfig.from_dict(data)


def test_override_unknown_key_gets_did_you_mean():
    with pytest.raises(ConfigError, match='"data.global_bach_size".*"data.global_batch_size"'):
        StrategyConfig().override({"data.global_bach_size": 4})


def test_override_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        StrategyConfig().override({"data.shard_policy.x": 1})


@pytest.mark.parametrize(
    "override, match",
    [
        ({"data.global_batch_size": "64"}, r"data.global_batch_size must be an integer or null"
         r"\. Received: data.global_batch_size='64' \(str\)"),
        ({"data.global_batch_size": True}, "must be an integer or null"),
        ({"data.global_batch_size": 0}, r"data.global_batch_size must be >= 1.*Received.*0"),
        ({"model_parallel.stages": 2.5}, "model_parallel.stages must be an integer"),
        ({"checkpoint.keep": -1}, "checkpoint.keep must be >= 1"),
        ({"checkpoint.backup_and_restore": "yes"}, "must be true/false"),
        ({"data_parallel.devices": "gpu:0"}, "must be a list of strings or null"),
        ({"data_parallel.devices": ["warp:0"]}, "Not a local device name.*warp:0"),
        ({"data_parallel.devices": []}, "at least one device"),
        ({"data_parallel.devices": ["/gpu:0", "GPU:0"]}, "lists a device twice: /device:GPU:0"),
        ({"communication.timeout_seconds": 0}, "timeout_seconds must be > 0"),
        ({"train.learning_rate": 0}, "learning_rate must be > 0"),
    ],
)
def test_wrong_types_and_ranges_name_field_and_value(override, match):
    with pytest.raises(ConfigError, match=match):
        StrategyConfig().override(override)


@pytest.mark.parametrize(
    "field, value, suggestion",
    [
        ("data_parallel.mode", "mirored", "mirrored"),
        ("data.shard_policy", "files", "file"),
        ("communication.compression", "fp61", "fp16"),
    ],
)
def test_enum_values_get_did_you_mean(field, value, suggestion):
    expected = f"Received: {field}='{value}'. Did you mean \"{suggestion}\""
    with pytest.raises(ConfigError, match=expected):
        StrategyConfig().override({field: value})


def test_placement_stage_out_of_range():
    with pytest.raises(ConfigError, match=r"placement\['block_3'\] names stage 2.*stages=2"):
        StrategyConfig().override(
            {"model_parallel.stages": 2, "model_parallel.placement": {"block_3": 2}}
        )


def test_placement_bad_regex():
    with pytest.raises(ConfigError, match=r"not a valid regular expression.*'block\['"):
        StrategyConfig().override({"model_parallel.placement": {"block[": 0}})


def test_microbatches_must_divide_the_batch():
    with pytest.raises(ConfigError, match="global_batch_size=30 is not divisible by "
                                          "model_parallel.microbatches=4"):
        StrategyConfig().override({"data.global_batch_size": 30, "model_parallel.microbatches": 4})


def test_batch_must_divide_over_listed_devices():
    with pytest.raises(ConfigError, match=r"global_batch_size=10 does not divide evenly across "
                                          r"4 replicas"):
        StrategyConfig().override(
            {"data.global_batch_size": 10,
             "data_parallel.devices": ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]}
        )


def test_per_replica_batch_must_split_into_microbatches():
    with pytest.raises(ConfigError, match=r"per-replica batch 6 .*model_parallel.microbatches=4"):
        StrategyConfig().override(
            {"data.global_batch_size": 12, "model_parallel.microbatches": 4,
             "data_parallel.devices": ["/cpu:0", "/cpu:1"]}
        )


def test_devices_must_divide_into_stages():
    with pytest.raises(ConfigError, match="lists 3 devices, which do not divide into "
                                          "model_parallel.stages=2"):
        StrategyConfig().override(
            {"model_parallel.stages": 2, "data_parallel.devices": ["/cpu:0", "/cpu:1", "/cpu:2"]}
        )


def test_mode_none_refuses_several_replicas():
    with pytest.raises(ConfigError, match="mode='none' trains one replica"):
        StrategyConfig().override(
            {"data_parallel.mode": "none", "data_parallel.devices": ["/cpu:0", "/cpu:1"]}
        )


def test_partitioner_checks():
    with pytest.raises(ConfigError, match="kind 'fixed' needs shards >= 1. Received: shards=0"):
        StrategyConfig().override({"parameter_server.partitioner": {"kind": "fixed", "shards": 0}})
    with pytest.raises(ConfigError, match="kind 'min_size' needs max_shards"):
        StrategyConfig().override({"parameter_server.partitioner": {"kind": "min_size"}})
    with pytest.raises(ConfigError, match="partitioners only apply in mode 'parameter_server'"):
        StrategyConfig().override(
            {"data_parallel.mode": "mirrored", "parameter_server.partitioner.shards": 2}
        )


def test_checkpoint_dir_without_frequency():
    with pytest.raises(ConfigError, match="nothing would be saved"):
        StrategyConfig().override({"checkpoint.dir": "/tmp/x", "checkpoint.every_epochs": None})


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("data:\n  global_batch_size: 64\n  shard_policy: [file\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+:\d+: YAML does not parse"):
        StrategyConfig.from_yaml(path)


def test_yaml_unknown_key_names_file_and_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(textwrap.dedent("""\
        data_parallel:
          mode: mirrored
        data:
          global_batch_sise: 64
        """))
    with pytest.raises(ConfigError, match=r'typo.yaml:4: Unknown config key '
                                          r'"data.global_batch_sise". Did you mean'):
        StrategyConfig.from_yaml(path)


def test_yaml_bad_value_names_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  shard_policy: whole\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2: data.shard_policy must be one of"):
        StrategyConfig.from_yaml(path)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match=r"Cannot read config file .*nope.yaml"):
        StrategyConfig.from_yaml(tmp_path / "nope.yaml")


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must be a mapping of sections"):
        StrategyConfig.from_dict(["data"])  # type: ignore[arg-type]


def test_empty_yaml_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert StrategyConfig.from_yaml(path) == StrategyConfig()


def test_keys_lists_every_dotted_key():
    keys = StrategyConfig.keys()
    assert "data.global_batch_size" in keys
    assert "parameter_server.partitioner.shards" in keys
    assert "communication.compression" in keys
    assert "communication.powersgd.rank" in keys


def test_powersgd_settings_default_and_override():
    config = StrategyConfig().override({"communication.compression": "powersgd"})
    assert config.communication.powersgd is None
    settings = config.communication.powersgd_settings
    assert (settings.rank, settings.warmup_steps, settings.min_elements) == (4, 0, 4096)
    tuned = config.override({"communication.powersgd.rank": 2,
                             "communication.powersgd.warmup_steps": 100})
    assert tuned.communication.powersgd_settings.rank == 2
    assert StrategyConfig.from_dict(tuned.to_dict()) == tuned


@pytest.mark.parametrize(
    "powersgd, match",
    [
        ({"rank": 0}, r"communication.powersgd.rank must be >= 1 .*Received: "
                      r"communication.powersgd.rank=0"),
        ({"rank": 2.5}, r"communication.powersgd.rank must be an integer\. Received: "
                        r"communication.powersgd.rank=2.5 \(float\)"),
        ({"rank": "4"}, "communication.powersgd.rank must be an integer"),
        ({"warmup_steps": -1}, r"communication.powersgd.warmup_steps must be >= 0"),
        ({"min_elements": -5}, r"communication.powersgd.min_elements must be >= 0"),
        ({"rnak": 2}, r'Unknown config key "communication.powersgd.rnak". Did you mean '
                      r'"communication.powersgd.rank"\?'),
    ],
)
def test_bad_powersgd_settings(powersgd, match):
    with pytest.raises(ConfigError, match=match):
        StrategyConfig.from_dict({"communication": {"compression": "powersgd",
                                                    "powersgd": powersgd}})


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16"])
def test_powersgd_keys_need_compression_powersgd(compression):
    with pytest.raises(ConfigError, match=(
        f"communication.powersgd is set but communication.compression='{compression}'; its "
        "keys apply only to compression 'powersgd'")):
        StrategyConfig().override({"communication.compression": compression,
                                   "communication.powersgd.rank": 2})


def test_powersgd_typo_in_a_yaml_file_names_the_line(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(textwrap.dedent("""\
        communication:
          compression: powersgd
          powersgd:
            rank: 2
            warmup_step: 10
        """))
    with pytest.raises(ConfigError, match=r'typo.yaml:5: Unknown config key '
                                          r'"communication.powersgd.warmup_step". Did you mean '
                                          r'"communication.powersgd.warmup_steps"'):
        StrategyConfig.from_yaml(path)


def test_evaluator_section_defaults_and_ranges():
    settings = StrategyConfig().evaluator
    assert (settings.log_dir, settings.poll_seconds, settings.timeout_seconds) == (None, 1.0, None)
    keys = StrategyConfig.keys()
    assert "evaluator.poll_seconds" in keys
    with pytest.raises(ConfigError, match=r"evaluator.poll_seconds must be > 0. Received: "
                                          r"evaluator.poll_seconds=0"):
        StrategyConfig().override({"evaluator.poll_seconds": 0})
    with pytest.raises(ConfigError, match="evaluator.timeout_seconds must be > 0 or null"):
        StrategyConfig().override({"evaluator.timeout_seconds": -1})
    with pytest.raises(ConfigError, match='Did you mean "evaluator.log_dir"'):
        StrategyConfig.from_dict({"evaluator": {"logdir": "x"}})


def test_model_parallel_schedule_defaults_to_gpipe_and_takes_1f1b():
    assert StrategyConfig().model_parallel.schedule == "gpipe"
    config = StrategyConfig().override({"model_parallel.stages": 2,
                                        "model_parallel.microbatches": 4,
                                        "model_parallel.schedule": "1f1b"})
    assert config.model_parallel.schedule == "1f1b"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_parallel.schedule": "1fb1"}, r"one of 'gpipe', '1f1b'\. Received: '1fb1'\. "
                                              r"Did you mean \"1f1b\"\?"),
        ({"model_parallel.schedule": "1f1b", "model_parallel.microbatches": 4},
         r"needs model_parallel.stages > 1 .*stages=1, microbatches=4"),
        ({"model_parallel.schedule": "1f1b", "model_parallel.stages": 2},
         r"model_parallel.microbatches > 1\. Received: stages=2, microbatches=1"),
    ],
)
def test_model_parallel_schedule_bad_input(overrides, message):
    with pytest.raises(ConfigError, match=message):
        StrategyConfig().override(overrides)
