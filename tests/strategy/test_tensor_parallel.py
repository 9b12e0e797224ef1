"""``model_parallel.tensor: 2`` through ``hybridpar.scope`` and plain ``model.fit``.

keras_hub GPT-2 (tied vocabulary), Llama (grouped heads, untied output) and BERT built from
tiny configs, with no layout rule written: once built, their attention heads, MLP
columns/rows and vocabulary are stored as shards on each group's 2 devices (4 logical
CPUs: 2 replicas x 2 shards, or one replica on 2 devices under mode ``none``), the
optimizer keeps one slot set per shard, and training reaches one device's weights.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_checks import causal_lm, fit_causal_lm, max_weight_difference, token_batch

import hybridpar
from hybridpar.errors import ConfigError
from hybridpar.parallel import slice_replay, tensor_calls
from hybridpar.parallel.split_variable import SplitVariable

pytestmark = pytest.mark.strategy

EXAMPLES = 36  # the last batch of 8 has 4 examples: 2 per replica


def train(config: dict, cls: str):
    return fit_causal_lm(config, cls, EXAMPLES)


def devices(variable) -> list[str]:
    return [tf.DeviceSpec.from_string(c.device).to_string().split("device:")[-1]
            for c in getattr(variable, "values", [variable])]


@pytest.fixture(scope="module", params=["GPT2Backbone", "LlamaBackbone"])
def single(request):
    return request.param, train({"data_parallel": {"mode": "none"}}, request.param)


@pytest.mark.parametrize("mode, shard_devices", [
    ("mirrored", [["CPU:0", "CPU:2"], ["CPU:1", "CPU:3"]]),
    ("none", [["CPU:0"], ["CPU:1"]]),
])
def test_fit_trains_the_shards_to_one_devices_weights(single, mode, shard_devices):
    cls, (expected, expected_loss) = single
    model, loss = train({"data_parallel": {"mode": mode}, "model_parallel": {"tensor": 2}}, cls)
    split = {v.path: v._value for v in model.weights if isinstance(v._value, SplitVariable)}
    ffn = next(v for p, v in split.items() if p.endswith("feedforward_intermediate_dense/kernel"))
    assert [devices(shard) for shard in ffn.variables] == shard_devices
    assert ffn.shape == (16, 32) and [tuple(s.shape) for s in ffn.variables] == [(16, 16)] * 2
    assert "token_embedding/embeddings" in split
    slots = [v for v in model.optimizer.variables if "_shard" in v.path]
    assert len(slots) == 2 * 2 * len(split)  # momentum and velocity of every shard
    split_calls = [layer.name for layer in model._flatten_layers()
                   if {"call", "_compute_attention"} & set(vars(layer))]
    # q, k, v, out, attention, MLP (Llama: gated, and the rotary embedding per shard of heads)
    per_block = {"GPT2Backbone": 7, "LlamaBackbone": 9}[cls]
    assert len(split_calls) == 2 * per_block + 1 and split_calls.count("self_attention") == 2
    assert "token_embedding" in split_calls  # the lookup and the logits, per vocabulary shard
    assert max_weight_difference(expected.get_weights(), model.get_weights()) <= 1e-5
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


def test_evaluate_and_predict_match_one_device_with_a_last_batch_under_the_replicas(single):
    cls, (expected, _) = single
    model, _ = train({"data_parallel": {"mode": "mirrored"}, "model_parallel": {"tensor": 2}},
                     cls)
    x, ids = token_batch(33, vocabulary=64)  # the last batch of 8 holds 1 example, 2 replicas
    labels = np.roll(ids, -1, axis=1)
    np.testing.assert_allclose(model.evaluate(x, labels, batch_size=8, verbose=0),
                               expected.evaluate(x, labels, batch_size=8, verbose=0), rtol=1e-5)
    predicted = model.predict(x, batch_size=8, verbose=0)
    assert predicted.shape == (33, 8, 64)
    np.testing.assert_allclose(predicted, expected.predict(x, batch_size=8, verbose=0),
                               rtol=1e-4, atol=1e-5)
    tensor_calls.uninstall(model)  # the layers read their split weights whole again
    assert not any({"call", "_compute_attention"} & set(vars(layer))
                   for layer in model._flatten_layers())
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0), predicted,
                               rtol=1e-5, atol=1e-6)


def test_describe_counts_each_shard_on_its_device():
    keras.utils.set_random_seed(5)
    with hybridpar.scope({"model_parallel": {"tensor": 2}}) as hs:
        model = causal_lm("GPT2Backbone")
        report = hs.describe(model)
    whole = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    plan = model._hybridpar_tensor_plan
    assert report.weight_bytes["/device:CPU:1"] == plan.split_bytes // 2
    assert report.weight_bytes["/device:CPU:0"] == plan.split_bytes // 2 + plan.whole_bytes
    assert plan.split_bytes + plan.whole_bytes == whole and plan.memory_ratio < 0.75


def test_a_size_the_key_value_heads_do_not_divide_fails_before_training():
    keras.utils.set_random_seed(5)
    with hybridpar.scope({"data_parallel": {"mode": "none"},
                          "model_parallel": {"tensor": 4}}):
        model = causal_lm("LlamaBackbone")
    x, ids = token_batch(8, vocabulary=64)
    with pytest.raises(ConfigError, match=r"tensor=4 does not divide the attention heads of "
                                          r"'.*key/kernel'.*has 2"):
        model.fit(x, ids, batch_size=8, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_a_model_with_nothing_to_split_is_refused():
    with hybridpar.scope({"model_parallel": {"tensor": 2}}) as hs:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="head")],
                                 name="tiny")
        expected = r"found no weight of model 'tiny' to split.*'tiny/head/kernel'"
        with pytest.raises(ConfigError, match=expected):
            hs.describe(model)


def test_a_rule_that_matches_nothing_is_refused():
    rules = {"model_parallel": {"tensor": 2, "tensor_layout": {"no_such_layer": 1}}}
    with hybridpar.scope(rules) as hs:
        model = causal_lm("GPT2Backbone")
        with pytest.raises(ConfigError, match="rule 'no_such_layer' matches no variable"):
            hs.describe(model)


def test_an_optimizer_built_before_the_split_is_refused():
    with hybridpar.scope({"model_parallel": {"tensor": 2}}) as hs:
        model = causal_lm("GPT2Backbone")
        model.optimizer.build(model.trainable_variables)
        with pytest.raises(ConfigError, match="before its optimizer is built"):
            hs.describe(model)


def test_an_optimizer_built_by_hand_after_the_split_is_refused():
    with hybridpar.scope({"model_parallel": {"tensor": 2}}) as hs:
        model = causal_lm("GPT2Backbone")
        hs.describe(model)
        with pytest.raises(ConfigError, match=r"Weight '.*' is split over 2 devices .* an "
                                              r"optimizer was given it whole"):
            model.optimizer.build(model.trainable_variables)


def test_a_model_not_built_is_refused():
    with hybridpar.scope({"model_parallel": {"tensor": 2}}) as hs:
        model = keras.Sequential([keras.layers.Dense(8, name="up"),
                                  keras.layers.Dense(4, name="down")])
        with pytest.raises(ConfigError, match=r"tensor=2 reads the built model, but layer\(s\) "
                                              r".*up, down of .* are not built"):
            hs.describe(model)


def traced_step(model, x, y) -> tf.Graph:
    """The graph of one training step of ``model`` on the batch ``(x, y)``."""
    strategy = model.distribute_strategy
    step = tf.function(lambda x, y: strategy.run(model.train_step, ((x, y),)))
    return step.get_concrete_function(tf.nest.map_structure(tf.constant, x),
                                      tf.constant(y)).graph


def fitted_on_one_batch(cls: str, mode: str = "none") -> tuple[keras.Model, dict, np.ndarray]:
    """``causal_lm(cls)`` split over 2 devices per replica (seed 5) and fit on one batch of 8,
    with that batch (``x``, token ids)."""
    keras.utils.set_random_seed(5)
    with hybridpar.scope({"data_parallel": {"mode": mode}, "model_parallel": {"tensor": 2}}):
        model = causal_lm(cls)
    x, ids = token_batch(8, vocabulary=64)
    model.fit(x, ids, batch_size=8, verbose=0)
    return model, x, ids


def whole_reads(model, x, y) -> list[str]:
    """The ops of one traced training step that join a split weight's shards (read it whole)."""
    graph = traced_step(model, x, y)
    return [op.name for op in graph.get_operations() if op.type == "ConcatV2" and all(
        source.op.type == "ReadVariableOp" for source in op.inputs[:-1])]


@pytest.mark.parametrize("cls", ["GPT2Backbone", "LlamaBackbone"])
def test_a_training_step_reads_no_split_weight_whole(cls):
    model, x, ids = fitted_on_one_batch(cls)
    assert whole_reads(model, x, ids) == []
    tensor_calls.uninstall(model)  # the class calls join the shards: lookup, logits, q/k/v...
    assert len(whole_reads(model, x, ids)) >= 2 + 2 * 6


def row_inputs_split(model, x, y) -> list[str]:
    """The Split ops of a traced step that cut a row layer's input (a joined activation)."""
    return [op.name for op in traced_step(model, x, y).get_operations()
            if op.type == "Split" and ("attention_output" in op.name
                                       or "feedforward_output" in op.name)]


def test_llama_attention_and_gated_mlp_run_on_each_shards_slices(monkeypatch):
    model, x, ids = fitted_on_one_batch("LlamaBackbone")
    assert row_inputs_split(model, x, ids) == []
    # Without the replay of silu(gate) * up and of the key/value heads' repeat, both row
    # layers of both blocks split an activation joined on the leader.
    monkeypatch.setattr(slice_replay, "replayed", lambda *args: None)
    monkeypatch.setattr(slice_replay, "repeated", lambda *args: None)
    assert len(row_inputs_split(model, x, ids)) == 4


def test_gradient_partials_are_summed_on_the_devices_that_made_them():
    model, x, ids = fitted_on_one_batch("GPT2Backbone")
    operations = traced_step(model, x, ids).get_operations()
    sums = [op for op in operations if op.type == "AddN"]
    on_shard_1 = [op for op in sums if all("CPU:1" in i.device for i in op.inputs)]
    assert on_shard_1 and all("CPU:1" in op.device for op in on_shard_1)  # GELU's 3 partials
    mixed = [op for op in sums if len({i.device for i in op.inputs}) > 1]
    assert mixed and all(len(op.inputs) == 2 for op in mixed)  # one sum per device, q/k/v too
    # the tied embedding shard's lookup gradient (IndexedSlices) is made dense on its shard
    dense = [op for op in operations
             if op.type == "UnsortedSegmentSum" and "CPU:1" in op.inputs[0].device]
    assert dense and all("CPU:1" in op.device for op in dense)


def test_each_shards_gradients_are_all_reduced_on_its_own_devices():
    model, x, ids = fitted_on_one_batch("GPT2Backbone", "mirrored")
    reduces = [op for op in traced_step(model, x, ids).get_operations()
               if op.type == "CollectiveReduceV2"]
    by_device = {}
    for op in reduces:
        key = int(tf.get_static_value(op.inputs[2]))  # input, group_size, group_key, ...
        by_device.setdefault(tf.DeviceSpec.from_string(op.device).device_index, set()).add(key)
    assert sorted(by_device) == [0, 1, 2, 3]  # upstream launches all on CPU:0 and CPU:2
    assert by_device[1] == by_device[3] and not by_device[1] & by_device[0]
    assert all(op.inputs[0].device == op.device for op in reduces)


def bert_classifier() -> keras.Model:
    """A keras_hub BERT backbone from a tiny config under a 3-class head on its pooled output."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=8, dropout=0.0)
    inputs = {name: keras.Input((8,), dtype=dtype, name=name) for name, dtype in
              (("token_ids", "int32"), ("segment_ids", "int32"), ("padding_mask", "bool"))}
    model = keras.Model(inputs, keras.layers.Dense(3, name="classifier")(
        backbone(inputs)["pooled_output"]))
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_bert_trains_to_one_devices_weights_with_no_rule_written():
    x, ids = token_batch(EXAMPLES, vocabulary=64)
    x["segment_ids"] = np.zeros_like(ids)
    labels = ids[:, 0] % 3
    trained = {}
    for name, config in (("single", {"data_parallel": {"mode": "none"}}),
                         ("split", {"data_parallel": {"mode": "mirrored"},
                                    "model_parallel": {"tensor": 2}})):
        keras.utils.set_random_seed(5)
        with hybridpar.scope(config):
            model = bert_classifier()
        model.fit(x, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
        trained[name] = model
    split_calls = [layer.name for layer in trained["split"]._flatten_layers()
                   if {"call", "_compute_attention"} & set(vars(layer))]
    assert len(split_calls) == 2 * 7 + 1  # q, k, v, out, attention, MLP per block; embedding
    assert max_weight_difference(trained["single"].get_weights(),
                                 trained["split"].get_weights()) <= 1e-5
