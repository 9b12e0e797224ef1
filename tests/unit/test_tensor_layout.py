"""Tensor-parallel layout: which axis of each weight a group splits (pure Python, no TensorFlow).

The weights are those keras_hub 0.32's Llama and GPT-2 backbones create (paths, owner
classes and shapes as ``hybridpar.parallel.tensor_weights`` reads them; the real models are
checked in tests/strategy/test_tensor_layout_models.py).
"""

import pytest

from hybridpar.errors import ConfigError
from hybridpar.topology.tensor_layout import (
    Split,
    WeightInfo,
    auto_layout,
    check_group,
    manual_layout,
    resolve_layout,
)

BLOCK = "transformer_layer_0"
LLAMA = [
    WeightInfo("token_embedding/embeddings", "ReversibleEmbedding", (64, 16)),
    WeightInfo("token_embedding/reverse_embeddings", "ReversibleEmbedding", (16, 64)),
    WeightInfo(f"{BLOCK}/self_attention/query/kernel", "EinsumDense", (16, 4, 4), "LlamaAttention"),
    WeightInfo(f"{BLOCK}/self_attention/key/kernel", "EinsumDense", (16, 2, 4), "LlamaAttention"),
    WeightInfo(f"{BLOCK}/self_attention/value/kernel", "EinsumDense", (16, 2, 4), "LlamaAttention"),
    WeightInfo(f"{BLOCK}/self_attention/attention_output/kernel", "EinsumDense", (4, 4, 16),
               "LlamaAttention"),
    WeightInfo(f"{BLOCK}/self_attention_layernorm/scale", "LlamaLayerNorm", (16,),
               "LlamaTransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_intermediate_dense/kernel", "Dense", (16, 32),
               "LlamaTransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_gate_dense/kernel", "Dense", (16, 32),
               "LlamaTransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_output_dense/kernel", "Dense", (32, 16),
               "LlamaTransformerDecoder"),
]
GPT2_MLP = [
    WeightInfo("position_embedding/embeddings", "PositionEmbedding", (8, 16)),
    WeightInfo(f"{BLOCK}/feedforward_intermediate_dense/kernel", "Dense", (16, 32),
               "TransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_intermediate_dense/bias", "Dense", (32,),
               "TransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_output_dense/kernel", "Dense", (32, 16),
               "TransformerDecoder"),
    WeightInfo(f"{BLOCK}/feedforward_output_dense/bias", "Dense", (16,), "TransformerDecoder"),
    WeightInfo("pooled_dense/kernel", "Dense", (16, 16)),
]


def axes(layout: dict) -> dict[str, int]:
    return {path: split.axis for path, split in layout.items()}


def test_auto_splits_llama_like_megatron():
    assert axes(auto_layout(LLAMA)) == {
        "token_embedding/embeddings": 0,
        "token_embedding/reverse_embeddings": 1,
        f"{BLOCK}/self_attention/query/kernel": 1,
        f"{BLOCK}/self_attention/key/kernel": 1,
        f"{BLOCK}/self_attention/value/kernel": 1,
        f"{BLOCK}/self_attention/attention_output/kernel": 0,
        f"{BLOCK}/feedforward_intermediate_dense/kernel": 1,
        f"{BLOCK}/feedforward_gate_dense/kernel": 1,
        f"{BLOCK}/feedforward_output_dense/kernel": 0,
    }


def test_auto_splits_a_column_layers_bias_and_keeps_a_row_layers_whole():
    layout = auto_layout(GPT2_MLP)
    assert layout[f"{BLOCK}/feedforward_intermediate_dense/bias"] == Split(0, "MLP columns")
    assert f"{BLOCK}/feedforward_output_dense/bias" not in layout  # added once, after the sum
    assert "position_embedding/embeddings" not in layout
    assert "pooled_dense/kernel" not in layout  # square, no partner: not a Megatron pair


def test_dense_layers_of_different_blocks_do_not_pair():
    weights = [WeightInfo("a/up/kernel", "Dense", (16, 32), "Block"),
               WeightInfo("b/down/kernel", "Dense", (32, 16), "Block")]
    assert auto_layout(weights) == {}


def test_only_token_embeddings_split_the_vocabulary():
    weights = [WeightInfo("segment_embedding/embeddings", "Embedding", (2, 16)),
               WeightInfo("token_ids_embedding/embeddings", "Embedding", (64, 16))]
    assert axes(auto_layout(weights)) == {"token_ids_embedding/embeddings": 0}


def test_manual_rules_override_auto_and_null_keeps_a_weight_whole():
    layout = resolve_layout(2, LLAMA, {"reverse_embeddings$": None, "layernorm/scale$": 0},
                            auto=True)
    assert "token_embedding/reverse_embeddings" not in layout
    assert layout[f"{BLOCK}/self_attention_layernorm/scale"] == Split(0, "rule")
    assert layout[f"{BLOCK}/self_attention/query/kernel"].axis == 1


def test_without_auto_only_the_rules_split():
    layout = resolve_layout(2, LLAMA, {"gate_dense/kernel$": -1}, auto=False)
    assert axes(layout) == {f"{BLOCK}/feedforward_gate_dense/kernel": 1}


def test_a_rule_that_matches_nothing_is_named():
    with pytest.raises(ConfigError, match=r"rule 'mlp_in' matches no variable.*"
                                          r"'token_embedding/embeddings'"):
        manual_layout({"mlp_in": 1}, LLAMA)


def test_a_path_two_rules_match_is_an_error():
    with pytest.raises(ConfigError, match=r"matches more than one rule: 'query', 'kernel'"):
        manual_layout({"query": 1, "kernel": 0}, LLAMA)


def test_an_invalid_regex_and_a_missing_axis_are_errors():
    with pytest.raises(ConfigError, match=r"not a valid regular expression.*Received: 'query\['"):
        manual_layout({"query[": 1}, LLAMA)
    with pytest.raises(ConfigError, match=r"splits axis 3 of .*shape \[16, 4, 4\] has 3 axes"):
        manual_layout({"query/kernel": 3}, LLAMA)


def test_a_tensor_size_that_does_not_divide_the_heads_names_them():
    with pytest.raises(ConfigError, match=r"tensor=4 does not divide the attention heads of "
                                          r"'transformer_layer_0/self_attention/key/kernel': "
                                          r"axis 1 of shape \[16, 2, 4\] has 2"):
        resolve_layout(4, LLAMA, {}, auto=True)
    assert len(resolve_layout(2, LLAMA, {}, auto=True)) == 9


def test_a_tensor_size_that_does_not_divide_the_vocabulary_names_it():
    weights = [WeightInfo("token_embedding/embeddings", "ReversibleEmbedding", (50257, 16))]
    with pytest.raises(ConfigError, match=r"tensor=2 does not divide the vocabulary.*has 50257"):
        resolve_layout(2, weights, {}, auto=True)
    assert resolve_layout(2, weights, {"embeddings": None}, auto=True) == {}


def test_the_group_must_divide_the_devices():
    check_group(2, 2, 8)
    with pytest.raises(ConfigError, match=r"tensor=3 x model_parallel.stages=1 = 3 devices per "
                                          r"replica does not divide the 4 devices"):
        check_group(3, 1, 4)
