"""Moving a dataset made before the parameter-server chief connected, against serializing it.

One localhost cluster (chief, 1 worker, 1 ps) started by
``hybridpar.launch.launch``; every task runs this script (``--child``). The
chief makes an in-memory ``from_tensor_slices`` dataset of ``--megabytes`` MB
before ``hybridpar.scope()`` connects it, then times, side by side:

* ``move``: ``strategies.chief_datasets.dataset_on_chief``, what the chief's
  ``evaluate``/``predict``/validation do with such a dataset (a ``take(-1)``
  made on the chief's device; nothing is copied);
* ``serialize``: ``dataset._as_serialized_graph()``, what re-creating it from
  its graph (``DatasetFromGraph``) would cost first, copying the data.

It checks that the moved dataset yields the same first batch and that a
second call returns the same object. The last line is
``move_vs_serialize=<move time / serialize time>``.

    python benchmarks/ps_early_dataset.py [--megabytes 200]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import time
from collections.abc import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_task(megabytes: int) -> dict:
    import numpy as np
    import tensorflow as tf

    import hybridpar
    from hybridpar.strategies import chief_datasets

    rows = megabytes * 1024 * 1024 // (64 * 4)
    values = np.random.default_rng(0).random((rows, 64), dtype=np.float32)
    early = tf.data.Dataset.from_tensor_slices(values).batch(1024)
    with hybridpar.scope({"data_parallel": {"mode": "parameter_server"}}):
        pass  # the chief connects here; worker and ps tasks serve and never return
    start = time.perf_counter()
    moved = chief_datasets.dataset_on_chief(early, "The dataset")
    move = time.perf_counter() - start
    start = time.perf_counter()
    serialized = len(early._as_serialized_graph().numpy())
    serialize = time.perf_counter() - start
    return {"bytes": values.nbytes, "move_s": move, "serialize_s": serialize,
            "serialized_bytes": serialized,
            "same_first_batch": bool(np.array_equal(next(iter(moved)).numpy(), values[:1024])),
            "cached": chief_datasets.dataset_on_chief(early, "The dataset") is moved}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        if os.environ.get("HYBRIDPAR_TASK") == "chief:0":
            print("RECORD " + json.dumps(run_task(args.megabytes)), flush=True)
        else:
            run_task(args.megabytes)
        return
    from hybridpar.launch import launch

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    out, err = io.StringIO(), io.StringIO()
    command = [sys.executable, os.path.abspath(__file__), "--child",
               f"--megabytes={args.megabytes}"]
    code = launch(command, 1, 1, timeout=300, env=env, stdout=out, stderr=err)
    found = re.search(r"RECORD (\{.*\})", out.getvalue())
    if code != 0 or found is None:
        raise RuntimeError(f"the cluster exited with {code}:\n{err.getvalue()[-3000:]}")
    record = json.loads(found[1])
    print(f"chief + 1 worker + 1 ps on localhost; a {record['bytes']:,} B from_tensor_slices "
          f"dataset made before hybridpar.scope(): moved in {record['move_s'] * 1e3:.1f} ms "
          f"(same first batch: {record['same_first_batch']}, cached: {record['cached']}), "
          f"serialized ({record['serialized_bytes']:,} B) in {record['serialize_s']:.3f} s")
    print(f"move_vs_serialize={record['move_s'] / record['serialize_s']:.4f}")


if __name__ == "__main__":
    main()
