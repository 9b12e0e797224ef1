"""The records of the fixes that are overrides in hybridpar's own code, not patches.

These correct an upstream behaviour by what hybridpar's strategy classes and
collectives do themselves, so they replace no Keras/TensorFlow attribute and
are never installed; their code lives in the layer that runs it, which sits
above or below ``compat`` and so does not register here itself. Recorded
here so that ``known()`` and ``describe()`` list every fix:

- ``replica_all_reduce``: ``hybridpar.parallel.all_reduce``;
- ``moving_statistics``: ``hybridpar.parallel.moving_statistics``.
"""

from __future__ import annotations

from hybridpar.compat.patching import Fix, register

REPLICA_ALL_REDUCE = register(Fix(
    name="replica_all_reduce",
    corrects="every traced replica all-reduce registers a gradient that keeps its strategy "
             "alive for the life of the process",
    group="core",
))
MOVING_STATISTICS = register(Fix(
    name="moving_statistics",
    corrects="each replica assigns its own batch's statistics to batch norm's moving mean "
             "and variance, so their mirrored copies drift apart",
    group="core",
))
