"""ParameterServerStrategy with an evaluator in TF_CONFIG, WITHOUT hybridpar.

Run by ``hybridpar launch --workers 1 --ps 1 --evaluator``: worker and ps tasks
serve; the evaluator, as a sidecar evaluator does, starts no server (it binds its
address without listening, so connections to it are refused as to no process,
and no other cluster's server started meanwhile on this machine can take the
port); the chief builds the strategy from TF_CONFIG, as TensorFlow's guide does.
The constructor keeps trying to reach the evaluator (tensorflow/tensorflow#46169):
the chief prints whether it connected within --wait seconds, then exits.
"""

import argparse
import json
import os
import socket
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--wait", type=float, default=10)
wait = parser.parse_args().wait
task = json.loads(os.environ["TF_CONFIG"])["task"]
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if task["type"] == "evaluator":
    port = int(resolver.cluster_spec().task_address("evaluator", 0).rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", port))
        time.sleep(wait + 5)  # past the chief's wait
    raise SystemExit(0)
if task["type"] in ("worker", "ps"):
    tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"],
                         task_index=task["index"], protocol="grpc").join()
connected = threading.Event()


def connect() -> None:
    tf.distribute.experimental.ParameterServerStrategy(resolver)
    connected.set()


start = time.monotonic()
threading.Thread(target=connect, daemon=True).start()
connected.wait(wait)
print(json.dumps({"connected": connected.is_set(), "waited": round(time.monotonic() - start, 1)}),
      flush=True)
os._exit(0)  # the constructor's thread may still be stuck connecting
