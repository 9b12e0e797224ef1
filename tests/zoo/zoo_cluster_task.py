"""One task of a real cluster training zoo models under the unmodified ``model.fit``.

Every task of ``hybridpar launch --workers 2`` (multi_worker) or ``--workers 1 --ps 2``
(parameter_server) runs this script; it writes ``<out>/<task>.json`` with, per model,
what the tests compare: the trained weights' digest and difference from a plain-Keras
reference trained in this process on the same batches, ``predict`` and ``evaluate``
against the same weights on one device, batch-norm statistics, and, with ``--mixed``, one
epoch of an MLP under ``mixed_float16`` and ``mixed_bfloat16`` against its reference.

    python zoo_cluster_task.py --out DIR --models MobileNetV2,BertTextClassifier [--mixed]
        [--uneven_files DIR]  (DIR holds the files of write_uneven_files)
"""

import argparse
import json
import os
import pathlib
import sys

import numpy as np

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/ (model_checks)

import keras
import model_checks
import tensorflow as tf
import zoo_models

BATCH = zoo_models.BATCH
EXAMPLES = 2 * BATCH + 1  # 2 replicas: a final batch of 1 is split 1 and one padded replica
PS_STEPS = 3


def fit_kwargs(data: tuple, parameter_server: bool, feed: str) -> tuple[tuple, dict]:
    """``fit``'s arguments: numpy arrays, or a ``tf.data`` dataset batched without
    ``drop_remainder`` (repeated for a fixed number of steps under parameter servers)."""
    x, y, weights = data
    if feed == "numpy":
        return (x, y), {"sample_weight": weights, "batch_size": BATCH, "shuffle": False}
    parts = (x, y) if weights is None else (x, y, weights)
    dataset = tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)
    if not parameter_server:
        return (dataset,), {}
    return (dataset.repeat(),), {"steps_per_epoch": PS_STEPS}


def reference(zoo: zoo_models.ZooModel, data: tuple, parameter_server: bool,
              feed: str) -> keras.Model:
    """The same model trained by plain Keras on one device, on the same batches."""
    keras.utils.set_random_seed(11)
    model = zoo.build()
    model.compile(**zoo.compile_kwargs())
    args, kwargs = fit_kwargs(data, parameter_server, feed)
    model.fit(*args, epochs=1, verbose=0, **kwargs)
    return model


def figures(model: keras.Model, data: tuple) -> tuple[dict, object]:
    x, y, weights = data
    found = model.evaluate(x, y, sample_weight=weights, batch_size=BATCH, verbose=0,
                           return_dict=True)
    return {k: float(v) for k, v in found.items()}, model.predict(x, batch_size=BATCH, verbose=0)


def row(zoo: zoo_models.ZooModel, hs: hybridpar.HybridStrategy, feed: str) -> dict:
    parameter_server = hs.mode == "parameter_server"
    data = zoo.data(EXAMPLES)
    keras.utils.set_random_seed(11)
    with hs.scope():
        model = zoo.build()
        model.compile(**zoo.compile_kwargs())
    args, kwargs = fit_kwargs(data, parameter_server, feed)
    history = model.fit(*args, epochs=1, verbose=0, **kwargs)
    result = {"loss": [float(v) for v in history.history["loss"]],
              "weights_sum": float(sum(np.sum(np.abs(w), dtype=np.float64)
                                       for w in model.get_weights()))}
    if parameter_server:  # each variable split over several ps: its shards' devices
        result["sharded"] = {
            v.path: sorted({shard.device for shard in v.value.variables})
            for v in model.variables if hasattr(v.value, "variables")}
    single = reference(zoo, data, parameter_server, feed)
    twin = model_checks.single_device_twin(zoo.build, model, zoo.compile_kwargs())
    if zoo.batch_norm:
        result["batch_norm_finite"] = model_checks.batch_norm_statistics_finite(model)
    else:
        result["weights"] = model_checks.max_weight_difference(single.get_weights(),
                                                               model.get_weights())
    (evaluated, predicted), (expected, twin_predicted) = figures(model, data), figures(twin, data)
    result["predict_rows"] = int(np.shape(keras.tree.flatten(predicted)[0])[0])
    result["predict"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
        keras.tree.flatten(predicted), keras.tree.flatten(twin_predicted), strict=True))
    result["evaluate"] = max(abs(evaluated[k] - v) / max(1.0, abs(v)) for k, v in expected.items())
    if hs.is_chief:
        path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"zoo-{os.getpid()}.keras"
        model.save(path)
        reloaded = keras.models.load_model(path)
        result["reloaded"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
            keras.tree.flatten(reloaded.predict(data[0], batch_size=BATCH, verbose=0)),
            keras.tree.flatten(twin_predicted), strict=True))
        path.unlink()
    return result


def mixed_precision(hs: hybridpar.HybridStrategy) -> dict:
    """Per policy: the largest difference of the one-epoch update from the reference's, in
    units of the policy's unit roundoff and relative to the reference's largest update."""
    found = {}
    data = (np.random.default_rng(8).normal(size=(EXAMPLES, 16)).astype("float32"),
            np.random.default_rng(9).integers(0, 4, EXAMPLES), None)
    zoo = zoo_models.ZooModel("mlp", model_checks.mixed_precision_mlp, lambda n: data,
                              model_checks.mixed_precision_compile)
    for policy, roundoff in model_checks.MIXED_POLICIES.items():
        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(11)
            with hs.scope():
                model = zoo.build()
                model.compile(**zoo.compile_kwargs())
                start = model.get_weights()
            parameter_server = hs.mode == "parameter_server"
            feed = "tf.data" if parameter_server else "numpy"
            args, kwargs = fit_kwargs(data, parameter_server, feed)
            model.fit(*args, epochs=1, verbose=0, **kwargs)
            single = reference(zoo, data, parameter_server, feed)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        found[policy] = model_checks.update_error(start, single.get_weights(),
                                                model.get_weights()) / roundoff
    return found


def write_uneven_files(directory: pathlib.Path) -> list[str]:
    """Two record files of 20 and 4 images: with file sharding over 2 workers the second
    worker's input ends 4 steps before the first's."""
    rng = np.random.default_rng(10)
    paths = []
    for index, count in enumerate((20, 4)):
        path = directory / f"images-{index}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for image in rng.uniform(0, 1, (count, 8, 8, 3)).astype("float32"):
                writer.write(tf.io.serialize_tensor(image).numpy())
        paths.append(str(path))
    return paths


def uneven_files(hs: hybridpar.HybridStrategy, paths: list[str]) -> dict:
    """A conv + batch-norm model on file-sharded records whose workers run out unevenly."""
    def parse(record):
        image = tf.ensure_shape(tf.io.parse_tensor(record, tf.float32), (8, 8, 3))
        return image, tf.reduce_mean(image)

    dataset = tf.data.Dataset.from_tensor_slices(paths).interleave(
        tf.data.TFRecordDataset).map(parse).batch(8)
    keras.utils.set_random_seed(11)
    with hs.scope():
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                                  keras.layers.BatchNormalization(), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    history = model.fit(dataset, epochs=1, verbose=0)
    return {"steps": int(model.optimizer.iterations.numpy()),
            "loss": [float(v) for v in history.history["loss"]],
            "batch_norm_finite": model_checks.batch_norm_statistics_finite(model),
            "weights_sum": float(sum(np.sum(np.abs(w), dtype=np.float64)
                                     for w in model.get_weights()))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="", help="name:feed,... (feed numpy or tf.data)")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--partitioner_shards", type=int, default=0)
    parser.add_argument("--uneven_files", default="", help="a directory for record files")
    flags = parser.parse_args()
    config = {}
    if flags.partitioner_shards:
        config["parameter_server"] = {
            "partitioner": {"kind": "fixed", "shards": flags.partitioner_shards}}
    with hybridpar.scope(config) as hs:  # workers and ps serve here until the chief is done
        pass
    report = {"mode": hs.mode, "num_replicas": hs.num_replicas, "models": {}}
    for case in filter(None, flags.models.split(",")):
        name, feed = case.split(":")
        report["models"][case] = row(zoo_models.ALL_MODELS[name], hs, feed)
    if flags.mixed:
        report["mixed"] = mixed_precision(hs)
    if flags.uneven_files:
        directory = pathlib.Path(flags.uneven_files)
        paths = sorted(str(p) for p in directory.glob("*.tfrecord"))
        report["uneven_files"] = uneven_files(hs, paths)
    task = os.environ.get("HYBRIDPAR_TASK", "single").replace(":", "-").split("@")[0]
    out = pathlib.Path(flags.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
