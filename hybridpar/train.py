"""The main job: train a model from ``hybridpar_models`` on a tfds data set.

``train(config, model_dir)`` is the library function behind
``hybridpar train``; it is plain Keras inside ``hybridpar.scope``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import hybridpar_models
import keras
import tensorflow as tf

from hybridpar import data
from hybridpar.callbacks import Throughput, ensure_writable
from hybridpar.config import StrategyConfig
from hybridpar.errors import ConfigError
from hybridpar.hybrid import scope
from hybridpar.parallel.timeline import PipelineTimeline
from hybridpar.report import PlacementReport


@dataclasses.dataclass
class TrainResult:
    """What a training run did, as printed in the closing summary."""

    mode: str
    num_replicas: int
    stages: int
    devices: list[str]
    global_batch_size: int
    epochs: int
    examples_per_sec: float
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    model_path: str
    log_dir: str
    placement_png: str
    seconds: float
    compression: str = "none"
    is_chief: bool = True
    stage_lines: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """A short human-readable report."""
        metrics = ", ".join(f"{k}={v:.4f}" for k, v in self.train_metrics.items())
        lines = [
            "hybridpar training summary",
            f"  mode              {self.mode}",
            f"  replicas          {self.num_replicas} x {self.stages} stage(s)",
            f"  devices           {', '.join(self.devices)}",
            f"  global batch      {self.global_batch_size}",
            f"  epochs            {self.epochs} in {self.seconds:.1f} s",
            f"  examples/s        {self.examples_per_sec:,.0f} (mean over epochs after the first)",
            f"  compression       {self.compression}",
            f"  final train       {metrics}",
        ]
        if self.eval_metrics:
            evals = ", ".join(f"{k}={v:.4f}" for k, v in self.eval_metrics.items())
            lines.append(f"  evaluation        {evals}")
        lines += [
            f"  saved model       {self.model_path}",
            f"  TensorBoard logs  {self.log_dir}",
            f"  placement         {self.placement_png}",
        ]
        lines += [f"  {line.strip()}" for line in self.stage_lines]
        return "\n".join(lines)


def input_pipeline(
    config: StrategyConfig, split: str, *, training: bool
) -> tf.data.Dataset:
    """The batched (image, label) pipeline of ``split`` for ``config``."""
    settings = config.train
    dataset = data.load_tfds(
        settings.dataset, split, settings.data_dir, as_supervised=True
    ).cache()
    if training and settings.shuffle:
        dataset = dataset.shuffle(4096, seed=settings.seed, reshuffle_each_iteration=True)
    return dataset.batch(config.data.global_batch_size).prefetch(tf.data.AUTOTUNE)


def build_model(config: StrategyConfig, num_classes: int, input_shape: tuple[int, ...]):
    """Builds and compiles ``train.model`` (call inside the strategy scope)."""
    settings = config.train
    model = hybridpar_models.get(settings.model)(
        num_classes=num_classes, input_shape=input_shape
    )
    try:
        optimizer = keras.optimizers.get(
            {"class_name": settings.optimizer, "config": {"learning_rate": settings.learning_rate}}
        )
    except ValueError:
        raise ConfigError(
            f"Unknown Keras optimizer. Received: train.optimizer={settings.optimizer!r}. "
            "Use a name keras.optimizers.get accepts, e.g. 'adam' or 'sgd'."
        ) from None
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@dataclasses.dataclass
class _Run:
    """What ``train`` built inside the scope."""

    hybrid: Any
    model_dir: Path
    log_dir: Path
    train_data: tf.data.Dataset
    eval_data: tf.data.Dataset | None
    model: keras.Model


def _checked(config: StrategyConfig, model_dir: str | Path) -> StrategyConfig:
    """``config`` with the evaluator's log directory under ``model_dir`` unless set.

    Raises:
        ConfigError: without ``data.global_batch_size``.
    """
    if config.data.global_batch_size is None:
        raise ConfigError(
            "hybridpar train needs data.global_batch_size. Received: null. "
            "Set it in the config or with --set data.global_batch_size=64."
        )
    if config.evaluator.log_dir is not None:
        return config
    evaluation_logs = Path(model_dir) / "logs" / "evaluation"
    return config.override({"evaluator.log_dir": str(evaluation_logs)})


def _set_up(config: StrategyConfig, model_dir: str | Path) -> _Run:
    """Seeds Keras, enters ``hybridpar.scope(config)``, builds the input pipelines and the
    model."""
    settings = config.train
    info = data.dataset_info(settings.dataset, settings.data_dir)
    keras.utils.set_random_seed(settings.seed)
    with scope(config) as hybrid:
        model_dir = ensure_writable(hybrid.output_dir(model_dir), key="--model_dir")
        train_data = input_pipeline(config, settings.train_split, training=True)
        eval_data = (
            input_pipeline(config, settings.eval_split, training=False)
            if settings.eval_split
            else None
        )
        input_shape = tuple(train_data.element_spec[0].shape[1:])
        model = build_model(config, info.features[info.supervised_keys[1]].num_classes, input_shape)
    log_dir = Path(config.evaluator.log_dir) if hybrid.is_evaluator else model_dir / "logs"
    return _Run(hybrid, model_dir, log_dir, train_data, eval_data, model)


def _callbacks(config: StrategyConfig, run: _Run) -> list[keras.callbacks.Callback]:
    """TensorBoard, the strategy's own callbacks and the pipeline timeline if asked for."""
    steps = config.train.timeline_steps
    timeline = [PipelineTimeline(run.model_dir, steps=steps)] if steps else []
    return [keras.callbacks.TensorBoard(log_dir=str(run.log_dir)), *run.hybrid.callbacks(),
            *timeline]


def _save(run: _Run) -> tuple[Path, Path, PlacementReport]:
    """Saves the model and its placement (text and picture).

    Returns:
        The model's path, the placement picture's path, and the placement report.
    """
    model_path = run.model_dir / "model.keras"
    run.model.save(model_path)
    placement = run.hybrid.describe(run.model)
    placement_png = run.model_dir / "placement.png"
    placement.save_png(placement_png)
    (run.model_dir / "placement.txt").write_text(f"{placement}\n")
    return model_path, placement_png, placement


def train(config: StrategyConfig, model_dir: str | Path, *, verbose: int = 1) -> TrainResult:
    """Trains ``config.train.model`` under ``hybridpar.scope(config)``.

    Writes TensorBoard logs to ``<model_dir>/logs``, the saved model to
    ``<model_dir>/model.keras`` and the summary to ``<model_dir>/summary.json``
    (on the chief; other workers write to private temporary dirs). On the
    cluster's evaluator task ``fit`` evaluates the chief's checkpoints: its
    summaries go to ``<model_dir>/logs/evaluation`` (unless
    ``evaluator.log_dir`` is set), its other files to ``<model_dir>/evaluator``.

    Raises:
        ConfigError: for a config that cannot train (before any training).
        hybridpar.data.DatasetNotFoundError: when the data is not prepared.
    """
    config = _checked(config, model_dir)
    settings = config.train
    started = time.perf_counter()
    run = _set_up(config, model_dir)
    throughput = Throughput(config.data.global_batch_size)
    history = run.model.fit(
        run.train_data,
        epochs=settings.epochs,
        steps_per_epoch=settings.steps_per_epoch,
        validation_data=run.eval_data,
        shuffle=False,
        callbacks=[throughput, *_callbacks(config, run)],
        verbose=verbose,
    )
    eval_metrics = ({} if run.eval_data is None
                    else run.model.evaluate(run.eval_data, return_dict=True, verbose=0))
    model_path, placement_png, placement = _save(run)
    rates = throughput.epoch_rates[1:] or throughput.epoch_rates
    hybrid = run.hybrid
    result = TrainResult(
        mode=hybrid.mode,
        num_replicas=hybrid.num_replicas,
        stages=hybrid.plan.mesh.stages,
        devices=list(hybrid.devices),
        global_batch_size=config.data.global_batch_size,
        epochs=settings.epochs,
        examples_per_sec=sum(rates) / len(rates) if rates else 0.0,  # none on the evaluator
        train_metrics=_final(history.history, prefix_excluded="val_"),
        eval_metrics={k: float(v) for k, v in eval_metrics.items()},
        model_path=str(model_path),
        log_dir=str(run.log_dir),
        placement_png=str(placement_png),
        seconds=time.perf_counter() - started,
        compression=_compression_summary(hybrid),
        is_chief=hybrid.is_chief,
        stage_lines=placement.stages.lines() if placement.stages is not None else [],
    )
    (run.model_dir / "summary.json").write_text(json.dumps(dataclasses.asdict(result), indent=2))
    return result


def _compression_summary(hybrid: Any) -> str:
    """What the gradient all-reduce sent, as the run log said it."""
    compression = hybrid.state.compression
    if compression is None:
        requested = hybrid.config.communication.compression
        return "none" if requested == "none" else f"none ({requested} needs several replicas)"
    return compression.report.summary() if compression.report else compression.kind


def _final(history: dict[str, list[Any]], prefix_excluded: str) -> dict[str, float]:
    return {
        k: float(v[-1])
        for k, v in history.items()
        if not k.startswith(prefix_excluded) and k not in ("examples_per_sec", "step")
    }
