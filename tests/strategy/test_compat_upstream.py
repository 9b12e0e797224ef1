"""Each fix in hybridpar.compat: the upstream behaviour, then the fix.

Upstream behaviour is reproduced in a fresh process without hybridpar
(tests/strategy/upstream_keras.py): if one of these starts failing, upstream
changed and the fix should be revisited.
"""

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
import upstream_keras  # beside this file; pytest puts its folder on sys.path
from upstream_runner import run_case  # beside this file

import hybridpar
from hybridpar.compat import versions
from hybridpar.parallel import all_reduce

pytestmark = pytest.mark.strategy

UPSTREAM = pathlib.Path(__file__).with_name("upstream_keras.py")


def run_upstream(case: str) -> dict:
    return run_case(UPSTREAM, case)


@pytest.mark.slow
def test_upstream_mirrored_strategies_share_collective_keys():
    outcomes = run_upstream("collective_keys_collide")["outcomes"]
    assert outcomes[0] == "ok"
    assert outcomes[1] != "ok", "upstream no longer collides: revisit mirrored_strategy()"


@pytest.mark.slow
def test_upstream_fit_burns_one_pass_of_the_dataset():
    result = run_upstream("fit_passes")
    assert result == {"single_passes": 2, "mirrored_passes": 3}


@pytest.mark.slow
def test_upstream_partial_batch_is_misweighted():
    assert run_upstream("partial_batch")["max_weight_diff"] > 1e-2


@pytest.mark.slow
def test_upstream_final_batch_leaves_a_cnn_replicas_empty():
    """TensorFlow's rebatch gives the final batch of 4 to one replica of 4.

    What an empty replica then does to a fused convolution depends on the kernel
    oneDNN picks for the CPU: on some machines it fails ("input depth must be
    evenly divisible by filter depth"), on others it runs; the zoo's MobileNetV2
    reproduction (test_compat_upstream_models.py) fails on both.
    """
    result = run_upstream("conv_on_empty_replica")
    assert result["last_split"] == [4, 0, 0, 0]
    outcome = result["outcome"]
    assert outcome == "ok" or "input depth must be evenly divisible by filter depth" in outcome


@pytest.mark.slow
def test_upstream_tf_keras_under_legacy_keras_fails_unhelpfully_then_recurses():
    result = run_upstream("legacy_keras_routing")
    assert result["outcomes"] == [
        "ImportError: Keras cannot be imported. Check that it is installed.",
        "RecursionError: maximum recursion depth exceeded while calling a Python object"]
    assert result["keras3"].startswith("keras.src.")  # `import keras` is not routed


@pytest.mark.slow
def test_keras_3_trains_under_legacy_keras_and_tf_keras_gets_an_explanation():
    result = run_case(UPSTREAM.with_name("legacy_keras.py"), "")
    assert result["trained"] and result["mode"] == "none"
    for outcome in [result["inside"], *result["outside"]]:  # no RecursionError the second time
        assert outcome.startswith("ImportError: tf.keras was used while TF_USE_LEGACY_KERAS=1 "
                                  "is set (Ray Train's TensorflowTrainer sets it")
        assert "tf_keras (Keras 2), which is not installed" in outcome
        assert "Use Keras 3 throughout: `import keras`" in outcome
        assert "os.environ['TF_USE_LEGACY_KERAS'] = '0'" in outcome


@pytest.mark.slow
def test_with_tf_keras_installed_only_tf_keras_inside_the_scope_is_refused():
    pytest.importorskip("tf_keras", reason="tf_keras is not installed (the test extra installs it)")
    result = run_case(UPSTREAM.with_name("legacy_keras.py"), "installed")
    assert result["trained"] and result["mode"] == "none"
    assert result["inside"].startswith("ImportError: tf.keras was used while TF_USE_LEGACY_KERAS=1")
    assert "routes tf.keras to tf_keras (Keras 2); hybridpar trains Keras 3" in result["inside"]
    assert result["outside"] == ["ok", "ok"]  # tf.keras outside the scope is tf_keras's


def test_batches_are_split_evenly_and_a_cnn_trains(tmp_path):
    dataset = upstream_keras.conv_dataset(str(tmp_path))
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}) as hs:
        batches = list(hs.strategy.experimental_distribute_dataset(dataset))
        model = upstream_keras.conv_model()
        model.compile("sgd", "mse")
    splits = [[int(v.shape[0]) for v in hs.strategy.experimental_local_results(piece.data[0])]
              for piece in batches]
    assert splits == [[4, 4, 4, 4], [1, 1, 1, 1]]
    history = model.fit(dataset, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_predict_keeps_example_order_on_a_partial_batch(tmp_path):
    dataset = upstream_keras.file_dataset(str(tmp_path))
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    predicted = model.predict(dataset.map(lambda x, y: x), verbose=0)
    # A reordered example is off by O(1); the absolute term absorbs the float rounding of
    # a different batch shape on outputs near zero.
    np.testing.assert_allclose(predicted, model(upstream_keras.FEATURES).numpy(),
                               rtol=1e-6, atol=1e-6)


def linear_fit(config: dict | None, dataset: tf.data.Dataset) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    with hybridpar.scope(config):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(dataset, epochs=2, verbose=0)
    return model.get_weights()


def test_fit_iterates_the_dataset_once_per_epoch():
    passes: list = []
    linear_fit({"data_parallel": {"mode": "mirrored"}}, upstream_keras.counting_dataset(passes))
    assert len(passes) == 2


@pytest.mark.parametrize("global_batch", [None, 16], ids=["counted", "folded-into-gradients"])
def test_partial_batch_is_weighted_by_examples(global_batch, tmp_path):
    single = linear_fit({"data_parallel": {"mode": "none"}},
                        upstream_keras.file_dataset(str(tmp_path)))
    mirrored = linear_fit({"data_parallel": {"mode": "mirrored"},
                           "data": {"global_batch_size": global_batch}},
                          upstream_keras.file_dataset(str(tmp_path)))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(single, mirrored, strict=True))
    assert diff <= 1e-5


def test_progress_loss_is_the_example_mean_on_a_partial_batch(tmp_path):
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    data = upstream_keras.file_dataset(str(tmp_path))
    reported = model.evaluate(data, verbose=0)
    predictions = model.predict(upstream_keras.FEATURES, verbose=0)
    expected = float(np.mean((predictions - upstream_keras.TARGETS) ** 2))
    assert reported == pytest.approx(expected, rel=1e-5)


def test_unverified_versions_are_refused(monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"verified on TensorFlow 2.19 with Keras 3.15; .*"
                       r"TensorFlow 2.21 with Keras 3.13, 3.14, 3.15; installed: "
                       rf"TensorFlow {tf.__version__}, Keras 3.99.0\. .* or set "
                       r"HYBRIDPAR_ALLOW_UNVERIFIED=1 to try this version anyway"):
        versions.check_versions()
    with pytest.raises(RuntimeError, match="Keras 3.99.0"):
        hybridpar.scope({"data_parallel": {"mode": "none"}}).__enter__()


def test_unverified_versions_only_warn_when_allowed(monkeypatch, caplog):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    monkeypatch.setenv(versions.ALLOW_ENV, "1")
    monkeypatch.setattr(versions, "_warned", False)
    with caplog.at_level("WARNING", logger="hybridpar"):
        versions.check_versions()
        versions.check_versions()
    warnings = [r.getMessage() for r in caplog.records if "Keras 3.99.0" in r.getMessage()]
    assert len(warnings) == 1 and "HYBRIDPAR_ALLOW_UNVERIFIED=1 is set" in warnings[0]


def test_upstream_device_scope_around_construction_is_ignored():
    result = run_upstream("device_scopes_and_slots")
    assert result["constructed_in_scope"].endswith("CPU:0"), "upstream now honours it: revisit"
    assert result["built_in_scope"].endswith("CPU:1")
    # What hybridpar relies on: Keras colocates optimizer slots with their variable.
    assert [d[-5:] for d in result["adam_slots"]] == ["CPU:1"]


def test_upstream_mirrored_weights_ignore_device_scopes_but_follow_colocate_with():
    result = run_upstream("mirrored_variable_devices")
    assert result["device_scope"] == ["CPU:0", "CPU:2"], "upstream now honours tf.device"
    # What place_variables_by_stage relies on.
    assert result["colocated"] == ["CPU:1", "CPU:3"]


def test_upstream_tape_gradient_ignores_the_forward_device():
    result = run_upstream("tape_gradient_device")
    assert result["forward"] == ["/device:CPU:1"]
    assert result["backward"] == [""], "upstream now places gradients: revisit the hook"


def test_upstream_tape_sums_partial_gradients_off_their_device():
    result = run_upstream("tape_sum_device")
    assert result["partials"] == ["/device:CPU:1"], result
    assert result["sums"] == [""], "upstream now sums where the partials are: revisit gradient_sums"


@pytest.mark.slow
def test_upstream_a_strategy_that_trained_is_never_collected():
    result = run_upstream("fit_keeps_the_strategy_alive")
    assert result["alive"], "upstream strategies are collected now: revisit replica_all_reduce"
    assert result["registered_gradients"] == 2  # one custom gradient per replica, never removed


def test_upstream_all_reduce_needs_one_dtype_no_branch_and_has_no_compression():
    result = run_upstream("all_reduce_limits")
    assert "'ConcatV2' Op have types [float16, float32] that don't all match" in (
        result["two_dtypes"]), result
    assert "`merge_call` called while defining a new graph or a tf.function" in (
        result["in_branch"]), result
    assert result["communication_options"] == [
        "bytes_per_pack", "implementation", "self", "timeout_seconds"]


def test_hybridpar_all_reduce_sums_two_dtypes_inside_a_branch():
    with hybridpar.scope({"data_parallel": {"mode": "mirrored"}}) as hs:
        switch = tf.Variable(True)

    @tf.function
    def step():
        def replica():
            one = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                          tf.float32)
            values = [tf.fill([2], one), tf.fill([3], tf.cast(one, tf.float16))]

            def reduce():
                return all_reduce.all_reduce_sum(values, in_branch=True)
            return tf.cond(switch, reduce, lambda: values)
        return hs.strategy.run(replica)

    for replica in range(hs.num_replicas):
        first, second = (hs.strategy.experimental_local_results(v)[replica] for v in step())
        assert first.dtype == tf.float32 and second.dtype == tf.float16
        np.testing.assert_array_equal(first.numpy(), [10.0, 10.0])  # 1 + 2 + 3 + 4
        np.testing.assert_array_equal(second.numpy(), [10.0, 10.0, 10.0])


@pytest.mark.slow
def test_upstream_tapes_build_a_weight_gradient_per_microbatch():
    assert run_upstream("per_microbatch_weight_gradients") == {
        "weight_gradient_matmuls": 4, "microbatches": 4}


@pytest.mark.slow
def test_upstream_the_step_that_meets_the_end_of_the_data_counts_on_some_copies():
    result = run_upstream("end_of_data_step")
    # 13 batches an epoch, 14 optimizer steps counted: the step with no batch counted too.
    assert result["single"] == [[14], [28], [42]], "upstream counts the batches now: revisit"
    counted = [copy for run in result["mirrored"] for epoch in run for copy in epoch]
    assert max(counted) > 3 * 13


def test_the_step_that_meets_the_end_of_the_data_changes_nothing():
    """hybridpar's trainer: 13 batches an epoch are 13 steps on every copy of iterations."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(194, 8)).astype("float32"), rng.normal(size=(194, 2)).astype("float32")
    for mode in ("none", "mirrored"):
        with hybridpar.scope({"data_parallel": {"mode": mode}}):
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
            model.compile(keras.optimizers.Adam(0.01), "mse")
        copies = []

        def record(epoch, logs, model=model, copies=copies):
            value = model.optimizer.iterations.value
            copies.append({int(c.numpy()) for c in getattr(value, "values", [value])})

        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).filter(lambda a, b: True)
        model.fit(data, epochs=3, verbose=0,
                  callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=record)])
        assert copies == [{13}, {26}, {39}], mode


def test_upstream_the_distributed_iterator_cannot_be_checkpointed():
    """Why fit's training input is hybridpar's own iterator where checkpoints save it
    (hybridpar.data.resumable; tensorflow/tensorflow#56372)."""
    outcomes = run_upstream("distributed_iterator_checkpoint")
    assert outcomes["plain"] == "ok"
    assert outcomes["distributed"] != "ok", "upstream checkpoints it now: revisit resumable_input"
