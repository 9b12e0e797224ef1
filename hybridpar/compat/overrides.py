"""The records of the fixes that are overrides in hybridpar's own code, not patches.

These correct an upstream behaviour by what hybridpar's strategy classes and
collectives do themselves, so they replace no Keras/TensorFlow attribute and
are never installed; their code lives in the layer that runs it, which sits
above or below ``compat`` and so does not register here itself. Recorded
here so that ``known()`` and ``describe()`` list every fix:

- ``replica_all_reduce``: ``hybridpar.parallel.all_reduce``;
- ``moving_statistics``: ``hybridpar.parallel.moving_statistics``;
- ``collective_keys``, ``collective_restart``, ``even_batches``,
  ``staged_variables``, ``ps_chief``, ``ps_evaluator_job``: the modules of
  those names in ``hybridpar.strategies``, used by its strategy classes;
- ``resumable_input``: ``hybridpar.data.resumable``, which the strategies'
  ``experimental_distribute_dataset`` return for ``fit``'s training input when
  a checkpoint saves it (``strategies.even_batches.distribute_resumably``), and
  ``hybridpar.checkpoint.input_state``, which saves and restores it.
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
COLLECTIVE_KEYS = register(Fix(
    name="collective_keys",
    corrects="two MirroredStrategy instances in one process share collective group key 1",
    group="core",
))
COLLECTIVE_RESTART = register(Fix(
    name="collective_restart",
    corrects="each new MultiWorkerMirroredStrategy re-enables collectives, resetting a peer's "
             "executor mid-handshake",
    group="core",
))
EVEN_BATCHES = register(Fix(
    name="even_batches",
    corrects="a global batch is split over replicas front-first or rounded up, leaving some "
             "replicas empty",
    group="core",
))
STAGED_VARIABLES = register(Fix(
    name="staged_variables",
    corrects="a strategy mirrors every variable over all replica devices, whatever stage "
             "its layer is on",
    group="core",
))
RESUMABLE_INPUT = register(Fix(
    name="resumable_input",
    corrects="the iterator fit reads under a tf.distribute strategy cannot be checkpointed, "
             "so a resume draws the batches already trained again",
    upstream="tensorflow/tensorflow#56372",
    group="core",
))
PS_CHIEF = register(Fix(
    name="ps_chief",
    corrects="a parameter-server strategy's datasets can only be iterated on workers, so "
             "Keras's evaluate and predict cannot run on the chief",
    group="parameter_server",
))
PS_EVALUATOR_JOB = register(Fix(
    name="ps_evaluator_job",
    corrects="ParameterServerStrategy connects to the evaluator task too and hangs, since "
             "the evaluator runs no server",
    upstream="tensorflow/tensorflow#46169",
    group="parameter_server",
))
