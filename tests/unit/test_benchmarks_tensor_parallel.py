"""Pure helpers of benchmarks/tensor_parallel.py (no TensorFlow)."""

import ast
from pathlib import Path

import pytest
from benchmark_loader import load_benchmark

tp = load_benchmark("tensor_parallel")
GROUPS = [["CPU:0", "CPU:1"], ["CPU:2", "CPU:3"]]
BLOCK_OP = "functional_1/gpt2_backbone_1/transformer_layer_0_1/ffn/hybridpar_stage0_shard1/MatMul"


def edge(producer, consumer, nbytes=4, tensor="t:0", producer_op="p", consumer_op="c"):
    return tp.Edge(tensor, producer, consumer, nbytes, producer_op, consumer_op)


def test_the_module_imports_no_tensorflow_at_top_level():
    tree = ast.parse(Path(tp.__file__).read_text())
    names = {alias.name.split(".")[0] for node in tree.body
             if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names} | {node.module.split(".")[0] for node in tree.body
                                         if isinstance(node, ast.ImportFrom) and node.module}
    assert not names & {"tensorflow", "keras", "keras_hub", "hybridpar", "numpy"}


def test_a_tensor_crossing_inside_a_group_counts_once_per_consumer_device():
    edges = [edge("CPU:0", "CPU:1"), edge("CPU:0", "CPU:1", consumer_op="c2"),  # same read
             edge("CPU:0", "CPU:0"),  # on its device
             edge("CPU:0", "CPU:2"),  # across replicas: the data-parallel all-reduce's
             edge("CPU:1", "CPU:0", tensor="u:0"), edge("", "CPU:1", tensor="v:0")]
    assert [(e.tensor, e.producer, e.consumer) for e in tp.crossings(edges, GROUPS)] == [
        ("t:0", "CPU:0", "CPU:1"), ("u:0", "CPU:1", "CPU:0")]


def test_megatrons_count_is_four_all_reduces_per_block_as_gather_and_broadcast():
    # 2 blocks, B=8, S=32, H=64, float32: 4 x 2(T-1) x 65,536 B per block
    assert tp.megatron_bytes(2, 8, 32, 64, 2) == 2 * 4 * 2 * 65_536
    assert tp.megatron_bytes(1, 1, 1, 1, 4, itemsize=2) == 4 * 2 * 3 * 2
    assert tp.megatron_bytes(3, 8, 32, 64, 1) == 0


def test_an_edge_is_the_optimizers_then_a_blocks_then_other():
    assert tp.category(edge("a", "b", producer_op=BLOCK_OP, consumer_op="adam/Reshape_3"),
                       "adam/") == "optimizer"
    assert tp.category(edge("a", "b", producer_op=BLOCK_OP, consumer_op="AddN_3"),
                       "adam/") == "blocks"
    assert tp.category(edge("a", "b", producer_op="functional_1/token_embedding_1/concat"),
                       "adam/") == "other"


def test_op_labels_merge_the_blocks():
    assert tp.op_label(BLOCK_OP) == "transformer_layer_*/ffn/hybridpar_stage0_shard1/MatMul"
    assert tp.op_label("gradient_tape/replica_1/functional_1/llama_backbone_1/"
                       "transformer_layer_12/x") == "gradient_tape/replica_1/transformer_layer_*/x"


def test_the_memory_share_is_the_fullest_device_of_the_group():
    held = {"CPU:0": 60, "CPU:1": 50, "CPU:2": 90}
    assert tp.largest_share(held, ["CPU:0", "CPU:1"], 100) == 0.6
    assert tp.largest_share({}, ["CPU:0"], 100) == 0.0


def test_the_wire_report_ends_with_the_blocks_ratio_per_group():
    edges = [edge("CPU:1", "CPU:0", 300, producer_op=BLOCK_OP),
             edge("CPU:3", "CPU:2", 300, producer_op="replica_1/" + BLOCK_OP),
             edge("CPU:0", "CPU:1", 40, consumer_op="adam/update/Sub"),
             edge("CPU:1", "CPU:0", 10, consumer_op="functional_1/token_embedding_1/concat")]
    lines = tp.wire_lines(edges, GROUPS, reference=200, optimizer="adam/", top=2)
    assert lines[-1] == "tp_wire_ratio=1.5000"
    assert lines[-2] == "tp_wire_bytes_whole_step=325"
    assert "blocks' activations 300 B (Megatron 200 B)" in lines[-3]
    assert "optimizer 20 B, embedding/output/loss 5 B" in lines[-3]
    assert lines[0] == ("edge (first group, all blocks): CPU:1 transformer_layer_*/ffn/"
                        "hybridpar_stage0_shard1/MatMul -> CPU:0 c: 300 B")
    assert len(lines) == 5


def test_arguments_are_checked():
    args = tp.parse_args([])
    assert (args.model, args.pairs, args.steps) == ("gpt2", 3, 10)
    assert tp.parse_args(["--model", "llama"]).model == "llama"
    for bad in (["--steps", "1"], ["--pairs", "0"], ["--model", "bert"]):
        with pytest.raises(SystemExit):
            tp.parse_args(bad)


def test_pairs_come_from_zero_and_alternate():
    assert tp.pair_orders(2) == [("sharded", "unsharded"), ("unsharded", "sharded")]
    assert set(tp.CONFIGS) == {"sharded", "unsharded"}
