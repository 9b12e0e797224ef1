"""Tensor parallelism (``model_parallel.tensor: 2``): parameter memory, group bytes, step time.

A keras_hub GPT-2 (or Llama, ``--model llama``) backbone built from a small
config (vocabulary 512, 2 blocks, hidden 64, 4 heads, intermediate 256,
sequence 32, random weights) with its token embedding's reverse as the output
layer, Adam, on 4 logical CPUs: 2 mirrored replicas x 2 shards ("sharded")
against 4 mirrored replicas ("unsharded"), global batch 16.

- ``tp_memory_ratio=``: the weights of the decoder blocks (paths
  ``transformer_layer_<i>/...``) one device of the tensor-parallel group holds,
  read from the variables' devices after ``hs.describe(model)``
  (``held_bytes``), over their unsplit bytes, the largest over the group's
  devices (target <= 1/T + 0.05). ``tp_memory_ratio_whole_model`` counts every
  weight (embeddings and norms included).
- ``tp_wire_ratio=``: the bytes one training step moves between the devices
  of one replica's group, over Megatron's count. Counted on the graph of one
  traced step (``strategy.run(model.train_step)``): every op's device is its
  requested one; an op with none takes its resource handle's device (variable
  reads), a captured or argument placeholder its value's device, any other its
  first input's (the placer's colocation); a function call's body ops default
  to the call's device. A tensor produced on device A and read on device B of
  the same group counts its bytes once per (tensor, B). Megatron's reference
  is the same point-to-point count: per block 2 all-reduces forward and 2
  backward of B*S*H elements (B the replica's batch), each done as a gather to
  one device and a broadcast, moving 2(T-1) x its size. Only the ops a call
  runs count (ancestors of the outputs and control outputs: a joined tensor
  no op reads is pruned). An edge with an op of the optimizer's scope at
  either end carries weight gradients or updates; else one with an op of a
  block at either end is the blocks' (the ratio); the rest (embedding, output
  layer, loss) and the optimizer's are printed apart, with the top edges.
- ``tp_step_ratio=``: median ``model.fit`` step time, sharded over unsharded,
  in interleaved pairs (the order alternates), median over pairs (reported).

    python benchmarks/tensor_parallel.py [--model {gpt2,llama}] [--pairs 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from zero import _timed_fit, pair_orders, pair_ratio  # beside this script

DEVICES = 4
TENSOR = 2
BATCH = 16  # global: 8 per replica with 2 shards, 4 per replica unsharded
SEQUENCE = 32
HIDDEN = 64
SIZES = {"vocabulary_size": 512, "num_layers": 2, "hidden_dim": HIDDEN,
         "intermediate_dim": 4 * HIDDEN}
HEADS = {"gpt2": {"num_heads": 4, "max_sequence_length": SEQUENCE, "dropout": 0.0},
         "llama": {"num_query_heads": 4, "num_key_value_heads": 2}}
BACKBONES = {"gpt2": "GPT2Backbone", "llama": "LlamaBackbone"}
BLOCK = re.compile(r"transformer_layer_\d+")
CONFIGS = {"sharded": {"data_parallel": {"mode": "mirrored"},
                       "model_parallel": {"tensor": TENSOR}},
           "unsharded": {"data_parallel": {"mode": "mirrored"}}}


class Edge(NamedTuple):
    """One tensor read by one op: where it was made and read, its bytes and op names."""

    tensor: str
    producer: str
    consumer: str
    nbytes: int
    producer_op: str
    consumer_op: str


# --------------------------------------------------------------------------- pure helpers


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BACKBONES), default="gpt2")
    parser.add_argument("--pairs", type=int, default=3, help="Interleaved pairs of runs.")
    parser.add_argument("--steps", type=int, default=10, help="Timed steps per run.")
    parser.add_argument("--top", type=int, default=8, help="Edges by op name to print.")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.steps < 2:
        parser.error("--pairs must be >= 1, --steps >= 2")
    return args


def crossings(edges: Iterable[Edge], groups: Sequence[Sequence[str]]) -> list[Edge]:
    """The edges between two devices of one group, each (tensor, consumer device) once."""
    group_of = {device: i for i, group in enumerate(groups) for device in group}
    seen: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        if edge.producer == edge.consumer or edge.producer not in group_of:
            continue
        if group_of[edge.producer] == group_of.get(edge.consumer):
            seen.setdefault((edge.tensor, edge.consumer), edge)
    return list(seen.values())


def category(edge: Edge, optimizer: str) -> str:
    """``optimizer`` when an op of the optimizer's scope (e.g. ``adam/``) makes or reads
    the tensor (weight gradients and updates), else ``blocks`` when an op of a decoder
    block does, else ``other`` (embedding, output layer, loss)."""
    ops = (edge.producer_op, edge.consumer_op)
    if any(op.startswith(optimizer) for op in ops):
        return "optimizer"
    return "blocks" if any(BLOCK.search(op) for op in ops) else "other"


def megatron_bytes(blocks: int, batch: int, sequence: int, hidden: int, tensor: int,
                   itemsize: int = 4) -> int:
    """Megatron's bytes per step in one group: 4 all-reduces of B*S*H per block, each
    a gather to one device and a broadcast (2(T-1) x its size)."""
    return blocks * 4 * 2 * (tensor - 1) * batch * sequence * hidden * itemsize


def op_label(name: str) -> str:
    """An op name without the model's scopes, its block index as ``*``."""
    name = re.sub(r"\b(functional|\w+_backbone)_\d+/", "", name)
    return re.sub(r"(transformer_layer_)\d+(_\d+)?", r"\1*", name)


def top_edges(edges: Iterable[Edge], count: int) -> list[tuple[str, int]]:
    """The ``count`` (producer, consumer) op names, blocks merged, that move the most bytes."""
    totals: collections.Counter[str] = collections.Counter()
    for edge in edges:
        totals[f"{edge.producer} {op_label(edge.producer_op)} -> {edge.consumer} "
               f"{op_label(edge.consumer_op)}"] += edge.nbytes
    return totals.most_common(count)


def largest_share(held: dict[str, int], devices: Sequence[str], whole: int) -> float:
    """The largest bytes one of ``devices`` holds, over ``whole``."""
    return max(held.get(device, 0) for device in devices) / whole


def wire_lines(edges: Sequence[Edge], groups: Sequence[Sequence[str]], reference: int,
               optimizer: str, top: int) -> list[str]:
    """The report of the crossing ``edges`` of ``groups`` (bytes per group, the first
    group's top edges), ``tp_wire_ratio=`` last."""
    per_group = collections.Counter({"blocks": 0, "optimizer": 0, "other": 0})
    for edge in edges:
        per_group[category(edge, optimizer)] += edge.nbytes / len(groups)
    lines = [f"edge (first group, all blocks): {name}: {nbytes:,} B"
             for name, nbytes in top_edges([e for e in edges if e.producer in groups[0]], top)]
    lines += [f"per group and step: blocks' activations {per_group['blocks']:,.0f} B "
              f"(Megatron {reference:,} B), weight gradients to and from the optimizer "
              f"{per_group['optimizer']:,.0f} B, embedding/output/loss "
              f"{per_group['other']:,.0f} B",
              f"tp_wire_bytes_whole_step={per_group.total():.0f}",
              f"tp_wire_ratio={per_group['blocks'] / reference:.4f}"]
    return lines


# --------------------------------------------------------------------------- TensorFlow


def _short(device: str) -> str:
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index or 0}" if spec.device_type else ""


def build(hybridpar: Any, keras: Any, model: str, config: dict) -> tuple[Any, Any]:
    """The compiled causal LM of ``model`` built in ``hybridpar.scope(config)``, described."""
    import keras_hub

    keras.utils.set_random_seed(1)
    with hybridpar.scope({**config, "data": {"global_batch_size": BATCH}}) as hs:
        backbone = getattr(keras_hub.models, BACKBONES[model])(**SIZES, **HEADS[model])
        inputs = {"token_ids": keras.Input((SEQUENCE,), dtype="int32", name="token_ids"),
                  "padding_mask": keras.Input((SEQUENCE,), dtype="bool", name="padding_mask")}
        lm = keras.Model(inputs, backbone.token_embedding(backbone(inputs), reverse=True))
        lm.compile(keras.optimizers.Adam(1e-3),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        hs.describe(lm)
    return lm, hs


def data(tf: Any, steps: int) -> Any:
    import numpy as np

    ids = np.random.default_rng(0).integers(1, SIZES["vocabulary_size"], (BATCH, SEQUENCE))
    x = {"token_ids": ids.astype("int32"), "padding_mask": np.ones_like(ids, dtype=bool)}
    return tf.data.Dataset.from_tensors((x, np.roll(ids, -1, 1).astype("int32"))).repeat(steps)


def memory_shares(model: Any, hs: Any) -> tuple[float, float]:
    """Blocks' and whole model's largest share of parameter bytes on one group device."""
    import numpy as np

    from hybridpar.parallel import held_bytes

    group = [_short(d) for d in hs.state.plan.mesh.group_devices(0, 0)]
    shares = []
    for weights in ([w for w in model.weights if BLOCK.match(w.path)], model.weights):
        held = {_short(d): b for d, b in held_bytes.variable_bytes_by_device(weights).items()}
        whole = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in weights)
        shares.append(largest_share(held, group, whole))
    return shares[0], shares[1]


def _live(graph: Any) -> set[Any]:
    """The ops a call of ``graph`` runs: ancestors of its outputs and control outputs."""
    live: set[Any] = set()
    stack = [t.op for t in graph.outputs] + list(graph.control_outputs)
    while stack:
        op = stack.pop()
        if op not in live:
            live.add(op)
            stack.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return live


def _operations(graph: Any, default: str) -> Iterable[tuple[Any, str]]:
    """The live ops of ``graph`` and of its function calls' bodies, with a default device."""
    live = _live(graph)
    for op in (op for op in graph.get_operations() if op in live):
        yield op, default
        if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
            body = graph._functions[op.get_attr("f").name].graph
            yield from _operations(body, _short(op.device) or default)


def op_devices(graph: Any, arguments: Sequence[Any]) -> dict[Any, str]:
    """Each op's device (see the module's docstring for ops that request none)."""
    held = {internal.op: _short(external.device) for external, internal in graph.captures}
    held.update((p.op, _short(a.device)) for p, a in zip(graph.inputs, arguments, strict=False))
    devices: dict[Any, str] = {}
    for op, default in _operations(graph, ""):  # producers come before their consumers
        device = _short(op.device) or held.get(op, "")
        inputs = [devices.get(t.op, "") for t in op.inputs]
        devices[op] = device or next((d for d in inputs if d), "") or default
    return devices


def step_edges(model: Any, hs: Any, tf: Any) -> list[Edge]:
    """Every (tensor, reading op) edge of one traced training step, with its devices."""
    strategy = hs.strategy
    batch = next(iter(strategy.experimental_distribute_dataset(data(tf, 1))))
    step = tf.function(lambda batch: strategy.run(model.train_step, (batch,)))
    graph = step.get_concrete_function(batch).graph
    devices = op_devices(graph, tf.nest.flatten(batch, expand_composites=True))
    edges = []
    for op, _ in _operations(graph, ""):
        for tensor in op.inputs:
            size = tensor.shape.num_elements() if tensor.shape.is_fully_defined() else 0
            nbytes = 0 if tensor.dtype in (tf.resource, tf.variant) else size * tensor.dtype.size
            edges.append(Edge(tensor.name, devices[tensor.op], devices[op], nbytes,
                              tensor.op.name, op.name))
    return edges


def wire(model: Any, hs: Any, tf: Any, top: int) -> list[str]:
    """The report of one step's bytes inside the groups, ``tp_wire_ratio=`` last."""
    mesh = hs.state.plan.mesh
    groups = [[_short(d) for d in mesh.group_devices(r, 0)] for r in range(mesh.replicas)]
    edges = crossings(step_edges(model, hs, tf), groups)
    reference = megatron_bytes(SIZES["num_layers"], BATCH // mesh.replicas, SEQUENCE, HIDDEN,
                               mesh.tensor)
    return wire_lines(edges, groups, reference, f"{model.optimizer.name}/", top)


def step_times(hybridpar: Any, keras: Any, tf: Any, args: argparse.Namespace
               ) -> list[dict[str, float]]:
    """Per interleaved pair, each variant's median ``fit`` step time."""
    built = {v: build(hybridpar, keras, args.model, CONFIGS[v])[0] for v in CONFIGS}
    for model in built.values():
        model.fit(data(tf, 3), epochs=1, verbose=0)  # trace and build before timing
    return [{v: _timed_fit(keras, built[v], data(tf, args.steps)) for v in order}
            for order in pair_orders(args.pairs)]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    import hybridpar

    hybridpar.testing.use_logical_cpus(DEVICES)
    import keras
    import tensorflow as tf

    model, hs = build(hybridpar, keras, args.model, CONFIGS["sharded"])
    blocks, whole = memory_shares(model, hs)
    model.fit(data(tf, 1), epochs=1, verbose=0)  # builds the optimizer on the shards
    wire_report = wire(model, hs, tf, args.top)
    pairs = step_times(hybridpar, keras, tf, args)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; {BACKBONES[args.model]} "
          f"{SIZES}, sequence {SEQUENCE}, global batch {BATCH}; {DEVICES} logical CPUs: "
          f"{hs.state.plan.mesh.replicas} replicas x {TENSOR} shards against {DEVICES} "
          f"replicas; {args.pairs} pair(s) of {args.steps} timed steps")
    for i, pair in enumerate(pairs):
        print(f"pair {i}: " + ", ".join(f"{v} {pair[v] * 1e3:.1f} ms" for v in pair))
    print(*wire_report[:-1], sep="\n")
    print(f"tp_memory_ratio_whole_model={whole:.4f}")
    print(f"tp_memory_ratio={blocks:.4f}")
    print(wire_report[-1])
    print(f"tp_step_ratio={pair_ratio(pairs):.4f}")


if __name__ == "__main__":
    main()
