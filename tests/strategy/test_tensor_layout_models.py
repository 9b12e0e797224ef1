"""The automatic tensor-parallel layout on keras_hub models nobody here wrote.

GPT-2, Llama and BERT backbones built from tiny configs (no downloads): the rules
must find Megatron's splits from the weights Keras created, with no hand-written rule.
"""

import pytest

from hybridpar.errors import ConfigError
from hybridpar.parallel.tensor_weights import weight_infos
from hybridpar.topology.tensor_layout import resolve_layout

pytestmark = [pytest.mark.strategy]

ATTENTION = {"query/kernel": 1, "key/kernel": 1, "value/kernel": 1, "attention_output/kernel": 0}
MLP = {"feedforward_intermediate_dense/kernel": 1, "feedforward_output_dense/kernel": 0}
BIASES = {"query/bias": 0, "key/bias": 0, "value/bias": 0,
          "feedforward_intermediate_dense/bias": 0}


def backbone(name: str, **kwargs):
    keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed in the venv")
    sizes = {"vocabulary_size": 64, "num_layers": 2, "hidden_dim": 16, "intermediate_dim": 32}
    return getattr(keras_hub.models, name)(**sizes, **kwargs)


def split_suffixes(model, size: int) -> dict[str, int]:
    """The split axes by path without the block prefix; every block must agree."""
    found: dict[str, int] = {}
    for path, split in resolve_layout(size, weight_infos(model), {}, auto=True).items():
        suffix = path.split("/", 1)[1] if path.startswith("transformer_layer_") else path
        assert found.setdefault(suffix, split.axis) == split.axis, path
    return found


def test_gpt2_splits_heads_mlp_and_the_tied_vocabulary():
    model = backbone("GPT2Backbone", num_heads=4, max_sequence_length=8)
    assert split_suffixes(model, 2) == {
        "token_embedding/embeddings": 0,
        **{f"self_attention/{k}": v for k, v in {**ATTENTION, **BIASES}.items()
           if not k.startswith("feedforward")},
        **MLP, "feedforward_intermediate_dense/bias": 0}


def test_llama_splits_grouped_heads_both_mlp_inputs_and_the_untied_output():
    model = backbone("LlamaBackbone", num_query_heads=4, num_key_value_heads=2)
    assert split_suffixes(model, 2) == {
        "token_embedding/embeddings": 0, "token_embedding/reverse_embeddings": 1,
        **{f"self_attention/{k}": v for k, v in ATTENTION.items()},
        **MLP, "feedforward_gate_dense/kernel": 1}
    with pytest.raises(ConfigError, match=r"tensor=4 does not divide the attention heads .*"
                                          r"key/kernel'.*has 2"):
        resolve_layout(4, weight_infos(model), {}, auto=True)


def test_bert_keeps_segment_and_position_embeddings_and_the_pooler_whole():
    model = backbone("BertBackbone", num_heads=4, max_sequence_length=8)
    found = split_suffixes(model, 4)
    assert found["token_embedding/embeddings"] == 0
    assert found["self_attention_layer/attention_output/kernel"] == 0
    assert not {"segment_embedding/embeddings", "position_embedding/embeddings",
                "pooled_dense/kernel"} & set(found)
