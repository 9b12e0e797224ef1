"""Hybrid data x model parallel `model.fit` on a multi-worker cluster (or alone).

Each worker trains one 2-stage model-parallel replica of a small transformer
over its two logical CPUs (HYBRIDPAR_LOGICAL_CPUS=2), pipelined over 2
microbatches (``--schedule gpipe | 1f1b``), with the optimizer's state
sharded over the two workers' replicas of each stage with ``--shard``; without TF_CONFIG it
trains on one device as the reference. Writes `<out>/<task>.json` with the
final weights and the local device of every variable and optimizer slot.
"""

import argparse
import json
import os
import pathlib
import re

import hybridpar_models
import keras
import tensorflow as tf

import hybridpar  # joins the TF_CONFIG cluster before the first TensorFlow op below
from hybridpar.parallel import held_bytes

hybridpar.log_to_stderr()  # show hybridpar's own lines: mode, sharding, checkpoints

RULES = {"^(embed|block_0)$": 0, "^(block_1|head.*)$": 1}


def local(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index}"


def devices_of(variable) -> list[str]:
    return [local(part.device) for part in held_bytes.storage([variable])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b"))
    parser.add_argument("--shard", action="store_true", help="shard_optimizer_state: true")
    args = parser.parse_args()
    task = os.environ.get("HYBRIDPAR_TASK", "single")

    dataset = hybridpar.data.load_tfds("hybridpar_digits", "train", args.data_dir,
                                       as_supervised=True).take(640).batch(64)
    clustered = "TF_CONFIG" in os.environ
    config = {
        "data": {"global_batch_size": 64, "shard_policy": "data"},
        "data_parallel": {"mode": "multi_worker", "shard_optimizer_state": args.shard}
        if clustered else {"mode": "none"},
        "model_parallel": (
            {"stages": 2, "placement": RULES, "microbatches": 2, "schedule": args.schedule}
            if clustered else {}
        ),
        "communication": {"timeout_seconds": 120},
    }
    keras.utils.set_random_seed(11)
    with hybridpar.scope(config) as hs:
        model = hybridpar_models.get("digits_transformer")(blocks=2, dim=16)
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=2, verbose=2)
    result = {
        "task": task, "mode": hs.mode, "num_replicas": hs.num_replicas,
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
        "devices": {v.path: devices_of(v) for v in model.weights + model.optimizer.variables},
        # the replica optimizers' slots (their scalars left out), and any variable that would
        # copy a shard of the weights (none: the optimizers update a ShardValue)
        "slot_devices": {} if hs.state.zero is None else {
            v.path: devices_of(v)
            for v in hs.state.zero.state_for(model.optimizer).replica_variables()
            if v.shape.rank},
        "shard_variables": [v.name for v in held_bytes.live_variables()
                            if re.fullmatch(r"zero_shard_\d+_replica_\d+(:\d+)?", v.name)],
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task.replace(':', '-')}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
