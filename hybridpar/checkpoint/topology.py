"""What a manifest records about the topology that wrote it, and the note a resume logs."""

from __future__ import annotations

from typing import Any

from hybridpar.checkpoint.manifest import describe_topology


def current(state: Any, strategy: Any, asynchronous: bool) -> dict[str, Any]:
    """The manifest's ``topology`` for the strategy (and hybridpar state) training now."""
    if state is None:
        return {"mode": type(strategy).__name__, "num_workers": 1,
                "num_replicas": strategy.num_replicas_in_sync, "devices": [],
                "global_batch_size": None}
    cluster = state.cluster
    topology = {
        "mode": state.mode,
        "num_workers": cluster.num_workers if cluster is not None else 1,
        "num_replicas": strategy.num_replicas_in_sync,
        "devices": list(state.plan.mesh.devices),
        "global_batch_size": state.global_batch_size,
    }
    if asynchronous and cluster is not None:
        topology["num_ps"] = cluster.num_ps
    return topology


def resume_note(manifest: dict[str, Any], now: dict[str, Any]) -> str:
    """``written by ..., resumed on ...; the global batch stays ...``."""
    written = describe_topology(manifest.get("topology", {}))
    batch = manifest.get("topology", {}).get("global_batch_size")
    current_batch = now.get("global_batch_size")
    if batch is not None and current_batch is not None and batch != current_batch:
        batch_note = (f"the global batch changed from {batch} to {current_batch}: the data "
                      f"position counts batches of the new size")
    elif current_batch is not None:
        batch_note = f"the global batch stays {current_batch} examples per step"
    else:
        batch_note = "the global batch stays what the dataset yields per step"
    return f"written by {written}, resumed on {describe_topology(now)}; {batch_note}."
