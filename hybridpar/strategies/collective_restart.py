"""A second MultiWorkerMirroredStrategy joins the running server instead of restarting it.

Upstream (TF 2.21, ``CollectiveAllReduceExtended._initialize_multi_worker``):
every new instance re-enables collective ops on the running context, because
it checks ``_std_server_started`` on the new instance only. That resets the
collective executor while a peer may already be sending to it, and the first
variable broadcast then hangs now and again (about one run in three here).
When this process's server is already up (``import hybridpar`` joined the
cluster), hybridpar's strategy is marked as started before it initialises,
so it only builds its collectives; health checks stay with the coordination
service, as for the first instance.
"""

from __future__ import annotations

from typing import Any


def mark_server_started(extended: Any) -> None:
    """Makes ``extended`` (before its ``__init__``) use the server that is already running."""
    extended._std_server_started = True
    extended._enable_check_health = False
