"""Reproduces upstream Keras/TF behaviours WITHOUT hybridpar (run as a script).

Each case prints one JSON line. tests/strategy/test_compat_upstream.py runs it in
a fresh process so that none of hybridpar's fixes are installed; when a case
stops reproducing, upstream has changed and the fix can be revisited.

    python upstream_keras.py CASE
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf


def logical_cpus(n: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )


def collective_keys_collide() -> dict:
    """Two MirroredStrategy instances over different devices in one process."""
    logical_cpus(4)
    outcomes = []
    for devices in (["/cpu:0", "/cpu:1"], ["/cpu:2", "/cpu:3"]):
        strategy = tf.distribute.MirroredStrategy(devices)

        @tf.function
        def replica_sum():
            return tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0))

        try:
            strategy.run(replica_sum)
            outcomes.append("ok")
        except tf.errors.OpError as err:
            outcomes.append(f"{type(err).__name__}: {err.message[-300:]}")
    return {"outcomes": outcomes}


FEATURES = np.random.default_rng(0).normal(size=(20, 4)).astype("float32")
TARGETS = FEATURES @ np.arange(1, 5, dtype="float32")[:, None]


def counting_dataset(counter: list) -> tf.data.Dataset:
    """A generator dataset that counts how often it is iterated."""

    def generate():
        counter.append(1)
        yield from zip(FEATURES, TARGETS, strict=True)

    spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
    return tf.data.Dataset.from_generator(generate, output_signature=spec).batch(16)


def file_dataset(directory: str, image: bool = False) -> tf.data.Dataset:
    """The same 20 examples read from a TFRecord file, batched by 16.

    With ``image``, the features are 2x2x1 images.
    """
    path = os.path.join(directory, "examples.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for row in np.concatenate([FEATURES, TARGETS], axis=1):
            writer.write(tf.io.serialize_tensor(row).numpy())
    rows = tf.data.TFRecordDataset(path).map(
        lambda record: tf.ensure_shape(tf.io.parse_tensor(record, tf.float32), (5,))
    )
    shape = (2, 2, 1) if image else (4,)
    return rows.map(lambda row: (tf.reshape(row[:4], shape), row[4:])).batch(16)


def train_linear(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset) -> list:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(dataset, epochs=2, verbose=0)
    return model.get_weights()


def fit_passes() -> dict:
    """How often model.fit(epochs=2) iterates the dataset, with and without a strategy."""
    logical_cpus(4)
    single, mirrored = [], []
    train_linear(tf.distribute.get_strategy(), counting_dataset(single))
    train_linear(tf.distribute.MirroredStrategy(), counting_dataset(mirrored))
    return {"single_passes": len(single), "mirrored_passes": len(mirrored)}


def partial_batch() -> dict:
    """20 file-based examples, global batch 16 over 4 replicas: the last step is 4 examples."""
    logical_cpus(4)
    with tempfile.TemporaryDirectory() as directory:
        single = train_linear(tf.distribute.get_strategy(), file_dataset(directory))
        mirrored = train_linear(tf.distribute.MirroredStrategy(), file_dataset(directory))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(single, mirrored, strict=True))
    return {"max_weight_diff": diff}


def conv_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((2, 2, 1)),
        keras.layers.Conv2D(8, 1, activation="relu"),
        keras.layers.Conv2D(8, 1, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ])


def conv_dataset(directory: str) -> tf.data.Dataset:
    """The 20 file-based examples as 2x2 images: batch 16 over 4 replicas."""
    return file_dataset(directory, image=True)


def conv_on_empty_replica() -> dict:
    """A CNN under MirroredStrategy whose final batch leaves replicas empty."""
    logical_cpus(4)
    strategy = tf.distribute.MirroredStrategy()
    with tempfile.TemporaryDirectory() as directory:
        dataset = conv_dataset(directory)
        last = list(strategy.experimental_distribute_dataset(dataset))[-1][0]
        split = [int(v.shape[0]) for v in strategy.experimental_local_results(last)]
        with strategy.scope():
            model = conv_model()
            model.compile("sgd", "mse")
        try:
            model.fit(dataset, epochs=1, verbose=0)
            outcome = "ok"
        except tf.errors.InvalidArgumentError as err:
            outcome = err.message.splitlines()[-1] if err.message else type(err).__name__
            outcome = next((line.strip() for line in err.message.splitlines()
                            if "divisible" in line), outcome)
    return {"last_split": split, "outcome": outcome}


def device_scopes_and_slots() -> dict:
    """Where Keras puts weights and Adam slots that a user tried to place on CPU:1."""
    logical_cpus(2)
    with tf.device("/cpu:1"):  # around construction: ignored, weights are built later
        constructed = keras.layers.Dense(2)
    constructed.build((None, 3))

    class PlacedDense(keras.layers.Dense):
        def build(self, input_shape):
            with tf.device("/cpu:1"):  # inside build: places the weights
                super().build(input_shape)

    placed = PlacedDense(2)
    placed.build((None, 3))
    optimizer = keras.optimizers.Adam()
    optimizer.build(placed.trainable_variables)
    slots = [v for v in optimizer.variables if "momentum" in v.path or "velocity" in v.path]
    return {
        "constructed_in_scope": constructed.kernel.value.device,
        "built_in_scope": placed.kernel.value.device,
        "adam_slots": sorted({v.value.device for v in slots}),
    }


def mirrored_variable_devices() -> dict:
    """Where MirroredStrategy puts a Keras weight built under tf.device, and under
    a ``colocate_with`` naming other devices (what hybridpar relies on)."""
    logical_cpus(4)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:2"])

    class Devices:
        _devices = ("/cpu:1", "/cpu:3")

    def colocated(next_creator, **kwargs):
        kwargs["colocate_with"] = Devices()
        return next_creator(**kwargs)

    with strategy.scope():
        with tf.device("/cpu:1"):
            in_device_scope = keras.layers.Dense(2)
            in_device_scope.build((None, 3))
        with tf.variable_creator_scope(colocated):
            colocated_layer = keras.layers.Dense(2)
            colocated_layer.build((None, 3))
    return {
        name: [v.device[-5:] for v in layer.kernel.value.values]
        for name, layer in (("device_scope", in_device_scope), ("colocated", colocated_layer))
    }


def tape_gradient_device() -> dict:
    """The device a tape asks for when it builds the gradient of a placed op."""
    logical_cpus(2)
    with tf.device("/cpu:1"):
        weight = tf.Variable(tf.ones((3, 3)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            with tf.device("/cpu:1"):
                y = tf.matmul(x, weight, name="forward")
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, weight)

    graph = step.get_concrete_function(tf.TensorSpec((2, 3))).graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    return {
        "forward": [op.device for op in matmuls if "gradient_tape" not in op.name],
        "backward": [op.device for op in matmuls if "gradient_tape" in op.name],
    }


def tape_sum_device() -> dict:
    """The device of the sum a tape builds of two partial gradients built on ``/cpu:1``."""
    logical_cpus(2)

    @tf.custom_gradient
    def doubled(x):
        def gradient(upstream):
            with tf.device("/cpu:1"):
                return tf.multiply(upstream, 2.0, name="partial")
        return 2.0 * x, gradient

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(doubled(x) * doubled(x))
        return tape.gradient(loss, x)

    graph = step.get_concrete_function(tf.TensorSpec((2, 3))).graph
    return {"partials": sorted({op.device for op in graph.get_operations()
                                if op.name.endswith("partial")}),
            "sums": [op.device for op in graph.get_operations() if op.type == "AddN"]}


def fit_keeps_the_strategy_alive() -> dict:
    """After fit, is a MirroredStrategy collected once nothing refers to it?"""
    import gc
    import weakref

    from tensorflow.python.framework import ops

    logical_cpus(2)
    registered = len(ops._gradient_registry._registry)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(FEATURES, TARGETS, batch_size=8, epochs=1, verbose=0)
    alive = weakref.ref(strategy)
    del strategy, model
    gc.collect()
    return {"alive": alive() is not None,
            "registered_gradients": len(ops._gradient_registry._registry) - registered}


def all_reduce_limits() -> dict:
    """What gradient compression meets in TensorFlow's replica all-reduce (2 mirrored CPUs):
    one batch all-reduce of a float32 and a float16 value (a gradient sent as fp16), an
    all-reduce inside a tf.cond branch (a warm-up switch), and what ``CommunicationOptions``
    lets a user configure about collectives."""
    import inspect

    logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def outcome(values_fn, in_branch: bool) -> str:
        @tf.function
        def step():
            def replica():
                context = tf.distribute.get_replica_context()
                def reduce():
                    return context.all_reduce("SUM", values_fn())
                return tf.cond(tf.constant(True), reduce, reduce) if in_branch else reduce()
            return strategy.run(replica)

        try:
            step()
        except Exception as err:  # the message is the result
            return f"{type(err).__name__}: {err}"
        return "ok"

    options = tf.distribute.experimental.CommunicationOptions
    return {
        "two_dtypes": outcome(lambda: [tf.ones([2]), tf.ones([2], tf.float16)], in_branch=False),
        "in_branch": outcome(lambda: [tf.ones([2])], in_branch=True),
        "communication_options": sorted(inspect.signature(options.__init__).parameters),
    }


def partial_dataset(batch: int = 8) -> tf.data.Dataset:
    """44 examples in batches of ``batch`` (a final partial batch), dynamic batch shape."""
    rng = np.random.default_rng(2)
    features = rng.normal(size=(44, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices(
        (features, features.sum(axis=1, keepdims=True))).batch(batch)


def small_mlp() -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)),
                             keras.layers.Dense(8, activation="relu", name="hidden"),
                             keras.layers.Dense(1, name="out")])


class OpsPerStep(keras.callbacks.Callback):
    """Records ``counts`` (a dict of counters) over each training step."""

    def __init__(self, counts: dict) -> None:
        super().__init__()
        self.counts, self.per_step = counts, []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = dict(self.counts)

    def on_train_batch_end(self, batch, logs=None):
        self.per_step.append({k: v - self.start[k] for k, v in self.counts.items()})


def count_eager_optional_ops(install=setattr) -> dict:
    """Counts ``has_value``/``get_value`` of Optionals run eagerly (outside any traced
    function) from now on; returns the live counters. ``install(owner, name, value)`` puts
    the counting methods in place (``setattr``, or pytest's ``monkeypatch.setattr``)."""
    from tensorflow.python.data.ops import optional_ops

    counts = {"has_value": 0, "get_value": 0}
    for name in counts:
        original = getattr(optional_ops._OptionalImpl, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            if tf.executing_eagerly():
                counts[_name] += 1
            return _original(self, *args, **kwargs)

        install(optional_ops._OptionalImpl, name, counted)
    return counts


def eager_optional_ops() -> dict:
    """How many Optional ops run eagerly (outside any traced function) in each training step."""
    logical_cpus(2)
    counts = count_eager_optional_ops()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = small_mlp()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    recorder = OpsPerStep(counts)
    model.fit(partial_dataset(), epochs=1, verbose=0, callbacks=[recorder])
    return {"per_step": recorder.per_step}


def steps_per_execution_mirrored() -> dict:
    """fit with steps_per_execution=3 under MirroredStrategy, a final partial batch."""
    logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = small_mlp()
        model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=3)
    try:
        model.fit(partial_dataset(), epochs=1, verbose=0)
        return {"outcome": "ok"}
    except tf.errors.OpError as err:
        lines = [line.strip() for line in err.message.splitlines() if "must feed" in line]
        return {"outcome": f"{type(err).__name__}: {lines[0] if lines else err.message}"}


def jit_compile_mirrored() -> dict:
    """fit with jit_compile=True under MirroredStrategy over 2 CPUs."""
    logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = small_mlp()
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=True)
    try:
        model.fit(partial_dataset(), epochs=1, verbose=0)
        return {"jit_compile": model.jit_compile, "outcome": "ok"}
    except tf.errors.OpError as err:
        lines = [line.strip() for line in err.message.splitlines() if "Trying to access" in line]
        return {"jit_compile": model.jit_compile, "outcome": lines[0] if lines else err.message}


def per_microbatch_weight_gradients() -> dict:
    """Weight-gradient MatMuls when each of 4 microbatches takes its own tape.gradient."""
    layer = keras.layers.Dense(16)
    layer.build((None, 8))

    @tf.function
    def step(x):
        total = None
        for part in tf.split(x, 4):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(part))
            (gradient,) = tape.gradient(loss, [layer.kernel])
            total = gradient if total is None else total + gradient
        return total

    graph = step.get_concrete_function(tf.TensorSpec((32, 8))).graph
    products = [op for op in graph.get_operations()
                if op.type == "MatMul" and op.get_attr("transpose_a")]
    return {"weight_gradient_matmuls": len(products), "microbatches": 4}


def legacy_keras_routing() -> dict:
    """``tf.keras`` (twice) with TF_USE_LEGACY_KERAS=1, as Ray Train sets it, without tf_keras."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.modules["tf_keras"] = None  # the test extra installs tf_keras; hide it
    outcomes = []
    for _ in range(2):
        try:
            tf.keras.layers.Dense(1)
            outcomes.append("ok")
        except (ImportError, RecursionError) as err:
            outcomes.append(f"{type(err).__name__}: {str(err)[:200]}")
    dense = keras.layers.Dense(1)  # Keras 3 itself is not routed
    return {"outcomes": outcomes, "keras3": type(dense).__module__}


def loss_scale_overflow_on_one_replica() -> dict:
    """A LossScaleOptimizer step under MirroredStrategy (2 CPUs) where only replica 1's
    half of the batch is inf: its gradients overflow, replica 0's do not."""
    logical_cpus(2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype("float32")
    x[8:] = np.inf
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 4, 16))).batch(16)
    model.fit(data, epochs=1, verbose=0)
    return {"finite_weights": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
            "scale": float(model.optimizer.dynamic_scale.numpy()),
            "iterations": int(model.optimizer.iterations.numpy())}


def end_of_data_step() -> dict:
    """fit (3 epochs) on 13 batches of unknown length (a filter), Adam, without a strategy
    and under MirroredStrategy over 4 CPUs: the optimizer steps counted per epoch, and the
    copies of ``iterations`` of each mirrored run (3 runs; the increment of the step that
    meets the end of the data reaches a random subset of copies)."""
    logical_cpus(4)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(194, 8)).astype("float32"), rng.normal(size=(194, 2)).astype("float32")

    def fit(strategy) -> list[list[int]]:
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).filter(lambda a, b: True)
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
            model.compile(keras.optimizers.Adam(0.01), "mse")
        copies: list[list[int]] = []

        def record(epoch, logs):
            value = model.optimizer.iterations.value
            copies.append([int(c.numpy()) for c in getattr(value, "values", [value])])

        model.fit(data, epochs=3, verbose=0,
                  callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=record)])
        return copies

    mirrored = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    return {"batches_per_epoch": 13, "single": fit(tf.distribute.get_strategy()),
            "mirrored": [fit(mirrored) for _ in range(3)]}


def distributed_iterator_checkpoint() -> dict:
    """tf.train.Checkpoint of the iterator fit reads under MirroredStrategy (2 CPUs), and of
    a plain tf.data iterator."""
    logical_cpus(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    data = tf.data.Dataset.range(64).shuffle(16, seed=1).batch(8)
    outcomes = {}
    for name, iterator in (("plain", iter(data)),
                           ("distributed", iter(strategy.experimental_distribute_dataset(data)))):
        next(iterator)
        try:
            tf.train.Checkpoint(iterator=iterator).write(os.path.join(tempfile.mkdtemp(), "c"))
            outcomes[name] = "ok"
        except Exception as err:  # what TensorFlow raises, reported
            outcomes[name] = f"{type(err).__name__}: {err}"
    return outcomes


CASES = {
    f.__name__: f
    for f in (
        all_reduce_limits,
        legacy_keras_routing,
        fit_keeps_the_strategy_alive,
        collective_keys_collide,
        fit_passes,
        partial_batch,
        conv_on_empty_replica,
        device_scopes_and_slots,
        mirrored_variable_devices,
        tape_gradient_device,
        tape_sum_device,
        eager_optional_ops,
        steps_per_execution_mirrored,
        jit_compile_mirrored,
        per_microbatch_weight_gradients,
        loss_scale_overflow_on_one_replica,
        end_of_data_step,
        distributed_iterator_checkpoint,
    )
}

if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]]()), flush=True)

