"""``hybridpar train --config configs/x.yaml [--set k=v ...]``: flags, then ``hybridpar.train``."""

from __future__ import annotations

import logging as std_logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from absl import app, flags, logging

from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError
from hybridpar.logs import log_to_stderr

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "configs/quickstart.yaml", "YAML config file.")
flags.DEFINE_multi_string("set", [], "Config override key=value (value parsed as YAML).")
flags.DEFINE_string("model_dir", None, "Output dir for logs and the model; default runs/<config>.")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data dir (overrides train.data_dir).")
flags.DEFINE_integer("logical_cpus", None, "Split the CPU into N logical devices (CPU-only hosts).")
flags.DEFINE_integer("verbose", 1, "Keras verbosity: 0 silent, 1 progress bar, 2 one line/epoch.")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parses ``--set key=value`` items; values are YAML (``256``, ``null``, ``[a, b]``).

    Raises:
        ConfigError: for an item without ``=`` or a value that is not YAML.
    """
    overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value. Received: --set {item!r}.")
        try:
            overrides[key.strip()] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(
                f"--set {key}: the value is not valid YAML. Received: {text!r}."
            ) from None
    return overrides


def load_config(path: str, overrides: Sequence[str], data_dir: str | None) -> StrategyConfig:
    """The config file with ``--set`` items and ``--data_dir`` applied."""
    values = parse_overrides(overrides)
    if data_dir is not None:
        values["train.data_dir"] = data_dir
    return StrategyConfig.from_yaml(path).override(values)


def _train_main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    log_to_stderr(std_logging.INFO)
    if FLAGS.logical_cpus:
        from hybridpar import testing

        testing.use_logical_cpus(FLAGS.logical_cpus)
    config = load_config(FLAGS.config, FLAGS.set, FLAGS.data_dir)
    from hybridpar.train import train

    model_dir = FLAGS.model_dir or str(Path("runs") / Path(FLAGS.config).stem)
    result = train(config, model_dir, verbose=FLAGS.verbose)
    if result.is_chief:  # the other workers trained the same model: one summary is enough
        print(result.summary(), flush=True)


USAGE = ("usage: hybridpar train [--config FILE] [--set KEY=VALUE ...] [--model_dir DIR]\n"
         "                       [--data_dir DIR] [--logical_cpus N] [--verbose 0|1|2]\n\n"
         "Train a model from a config; --helpfull lists absl's own flags too.\n")


def run(argv: list[str]) -> None:
    """Runs ``hybridpar train`` (``argv[0]`` is the program name); exits 2 on bad input."""
    from hybridpar.data import DatasetNotFoundError

    if any(arg in ("-h", "--help", "--helpshort", "-?") for arg in argv[1:]):
        # absl's --help lists the key flags of the console script's module, which
        # defines none: the train flags are this module's.
        print(USAGE + "\nflags:\n" + FLAGS.module_help(__name__))
        sys.exit(0)
    try:
        app.run(_train_main, argv=argv)
    except (ConfigError, DatasetNotFoundError) as err:
        print(f"hybridpar train: error: {err}", file=sys.stderr)
        sys.exit(2)


