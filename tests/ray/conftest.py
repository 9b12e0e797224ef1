"""One real local Ray cluster for the whole test session (the `ray` marker).

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when it is imported: "0" keeps the
single-node cluster and all its traffic on loopback. The cluster's workers get
this folder on their PYTHONPATH, so Ray Train can import ``ray_loops``.
"""

import os
import pathlib

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
try:
    import ray
except ModuleNotFoundError:  # each test module skips itself with the install command
    ray = None

HERE = pathlib.Path(__file__).parent
RAY_CPUS = 6  # logical: the largest cluster here (chief + 2 workers + 2 ps) and the driver


@pytest.fixture(scope="session")
def ray_address() -> str:
    """Starts the session's Ray cluster; returns its address for `--address` and drivers."""
    pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    context = ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=True,
                       _node_ip_address="127.0.0.1",
                       runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    yield context.address_info["gcs_address"]
    ray.shutdown()
