"""Fixes to Keras/TensorFlow internals, one module per upstream behaviour.

Each module names the behaviour it corrects (with the upstream issue where
one exists) and registers a ``patching.Fix``. Two kinds:

- overrides used by hybridpar's own strategy classes (``collective_keys``,
  ``even_batches``, ``collective_restart``, ``staged_variables``, the
  per-replica hook of ``replica_share``, the leak-free all-reduce of
  ``replica_all_reduce``, the parameter-server chief's own steps
  ``ps_chief``, its cluster without the evaluator ``ps_evaluator_job`` and
  its datasets made before it connected ``local_job``,
  the training loops ``step_loop`` and ``xla_replicas`` that
  ``optional_outputs`` builds for owned models, and the batch-norm
  statistics those average, ``moving_statistics``): they act only on
  strategies hybridpar built, by construction;
- patches of Keras/TensorFlow attributes (``symbolic_build``,
  ``replica_share``, ``gradient_all_reduce``, ``metric_reduction``,
  ``unbatched_input``, ``chief_files``, ``microbatch_step``, ``legacy_keras``,
  ``gradient_compression``, ``optional_outputs``, ``padded_steps``, ``sync_batch_norm``,
  ``model_scope`` (models built outside the scope), the stage hooks
  ``stage_marks``/``stage_calls``/``stage_gradients``/``weight_gradient_split``, and the
  parameter-server fixes ``shard_views``, ``sharded_embedding``,
  ``sharded_numpy``, ``atomic_updates``, and ``runner_routing``, which sends
  ``fit``/``evaluate``/``predict`` to the parameter-server chief's or the
  evaluator's runner): each patched
  function first asks whether the model or strategy at hand is hybridpar's
  and otherwise calls the original with the same arguments. They are
  installed while something needs them (see ``patching``) and
  ``uninstall()`` restores every original.

All of it is verified on the TensorFlow/Keras lines in ``versions``; tests in
``tests/strategy/test_compat_*.py`` reproduce each upstream behaviour in a
fresh process without hybridpar.
"""

from __future__ import annotations

from hybridpar.compat import (  # noqa: F401  (each module registers its fix)
    atomic_updates,
    chief_files,
    gradient_all_reduce,
    gradient_compression,
    legacy_keras,
    local_job,
    metric_reduction,
    microbatch_step,
    model_scope,
    optional_outputs,
    overrides,
    padded_steps,
    replica_share,
    runner_routing,
    shard_views,
    sharded_embedding,
    sharded_numpy,
    stage_calls,
    stage_gradients,
    stage_marks,
    step_loop,
    symbolic_build,
    sync_batch_norm,
    unbatched_input,
    weight_gradient_split,
    xla_replicas,
)
from hybridpar.compat.patching import Fix, hold, holding, installed, known, uninstall
from hybridpar.compat.versions import VERIFIED_KERAS, VERIFIED_TF, check_versions


def describe() -> str:
    """A report for bug reports: versions, and every fix with whether it is installed."""
    import keras
    import tensorflow as tf

    active = {fix.name for fix in installed()}
    lines = [
        f"hybridpar Keras/TF fixes (TensorFlow {tf.__version__}, Keras {keras.__version__}; "
        f"verified on TensorFlow {', '.join(VERIFIED_TF)}, Keras {', '.join(VERIFIED_KERAS)})"
    ]
    for fix in known():
        if not fix.patches:
            status = "override in hybridpar's strategies"
        else:
            status = "installed" if fix.name in active else f"not installed ({fix.group})"
        upstream = f" [{fix.upstream}]" if fix.upstream else ""
        lines.append(f"  {fix.name:20s} {status:36s} {fix.corrects}{upstream}")
    return "\n".join(lines)


__all__ = [
    "VERIFIED_KERAS",
    "VERIFIED_TF",
    "Fix",
    "check_versions",
    "describe",
    "hold",
    "holding",
    "installed",
    "known",
    "uninstall",
]
