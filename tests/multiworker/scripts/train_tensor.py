"""Tensor-parallel `model.fit` of keras_hub GPT-2 on a multi-worker cluster (or alone).

Each worker trains one replica of a GPT-2 (``--backbone LlamaBackbone``: Llama)
backbone built from a tiny config (``model_checks.causal_lm``), its
attention heads, MLP and vocabulary split over the worker's two logical CPUs
(``model_parallel.tensor: 2``, HYBRIDPAR_LOGICAL_CPUS=2); with ``--stages``, in 2
pipeline stages of 2 shards each on 4 logical CPUs, 2 microbatches on the 1F1B
schedule. Without TF_CONFIG it trains on one device as the reference. 36 token
sequences in batches of 8: the last batch of 4 gives each worker 2. Writes
`<out>/<task>.json` with the final weights, the losses and the local devices of every
split weight's shards.
"""

import argparse
import json
import os
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op below
from hybridpar.parallel.split_variable import SplitVariable

sys.path.insert(0, str(pathlib.Path(__file__).parents[2]))  # tests/: the shared helpers
from model_checks import causal_lm

hybridpar.log_to_stderr()


def shard_devices(variable) -> list[str]:
    return [tf.DeviceSpec.from_string(shard.device).to_string().split("device:")[-1]
            for shard in variable._value.variables]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--backbone", default="GPT2Backbone",
                        choices=["GPT2Backbone", "LlamaBackbone"])
    args = parser.parse_args()
    pipeline = {"stages": 2, "microbatches": 2, "schedule": "1f1b"} if args.stages else {}
    task = os.environ.get("HYBRIDPAR_TASK", "single")
    clustered = "TF_CONFIG" in os.environ
    config = {
        "data": {"global_batch_size": 8, "shard_policy": "data"},
        "data_parallel": {"mode": "multi_worker"} if clustered else {"mode": "none"},
        "model_parallel": {"tensor": 2, **pipeline} if clustered else {},
        "communication": {"timeout_seconds": 120},
    }
    ids = np.random.default_rng(0).integers(1, 64, (36, 8)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    dataset = tf.data.Dataset.from_tensor_slices((x, np.roll(ids, -1, axis=1))).batch(8)
    keras.utils.set_random_seed(5)
    with hybridpar.scope(config) as hs:
        model = causal_lm(args.backbone)
    history = model.fit(dataset, epochs=2, verbose=2)
    result = {
        "task": task, "mode": hs.mode, "num_replicas": hs.num_replicas,
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
        "shards": {v.path: shard_devices(v) for v in model.weights
                   if isinstance(v._value, SplitVariable)},
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task.replace(':', '-')}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
