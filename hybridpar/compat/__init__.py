"""Hooks into Keras/TensorFlow internals, one module per upstream behaviour.

Each module names the behaviour it corrects (with the upstream issue where
one exists) and registers a ``patching.Fix``. Keras's trainer methods
(``fit``/``evaluate``/``predict``, the steps, the functions Keras traces,
the symbolic build, the epoch iterator) are reached through one thin hook
each, the table of ``trainer_hooks``, which hands them to the strategy's
trainer (``hybridpar.training``); the fixes that are parts of that trainer
(``runner_routing``, ``microbatch_step``, ``gradient_compression``,
``padded_steps``, ``optional_outputs``, ``step_loop``, ``symbolic_build``,
``unbatched_input``, ``end_of_data_step``) hold the code it runs and name
``trainer_hooks`` in ``part_of``; ``xla_replicas`` is the replicated ``jit_compile`` step they use.
The others patch Keras/TensorFlow attributes of their own
(``replica_share``, ``gradient_all_reduce``, ``loss_scale_finiteness``,
``metric_reduction``,
``chief_files``, ``legacy_keras``, ``sync_batch_norm``,
``sharded_optimizer`` (ZeRO stage 1), ``model_scope`` (models built outside
the scope), the stage hooks ``stage_marks``/``stage_calls``/
``stage_gradients``/``weight_gradient_split``/``gradient_sums``, and the parameter-server
fixes ``shard_views``, ``sharded_embedding``, ``sharded_numpy``,
``atomic_updates``): each patched function first asks whether the model or
strategy at hand is hybridpar's and otherwise calls the original with the
same arguments. They are installed while something needs them (see
``patching``) and ``uninstall()`` restores every original. ``local_job``
tells what the parameter-server chief's connection stranded
(``model_scope`` checks it).

The other fixes are overrides in hybridpar's own code, which live in the
layer that runs them: the collectives in ``hybridpar.parallel``
(``all_reduce``, ``moving_statistics``) and the strategy classes' overrides in
``hybridpar.strategies`` (``collective_keys``, ``collective_restart``,
``even_batches``, ``staged_variables``, ``ps_chief``, ``ps_evaluator_job``,
``chief_datasets``) and the resumable training input (``resumable_input``:
``hybridpar.data.resumable``, ``hybridpar.checkpoint.input_state``).
``overrides`` holds their records, so that ``known()``
and ``describe()`` list every fix; nothing here imports them.

All of it is verified on the TensorFlow/Keras lines in ``versions``; tests in
``tests/strategy/test_compat_*.py`` reproduce each upstream behaviour in a
fresh process without hybridpar.
"""

from __future__ import annotations

from hybridpar.compat import (  # noqa: F401  (each module registers its fix)
    atomic_updates,
    chief_files,
    end_of_data_step,
    gradient_all_reduce,
    gradient_compression,
    gradient_sums,
    legacy_keras,
    local_job,
    loss_scale_finiteness,
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
    sharded_optimizer,
    stage_calls,
    stage_gradients,
    stage_marks,
    step_loop,
    symbolic_build,
    sync_batch_norm,
    trainer_hooks,
    unbatched_input,
    weight_gradient_split,
    xla_replicas,
)
from hybridpar.compat.patching import (
    Fix,
    hold,
    holding,
    installed,
    is_installed,
    known,
    uninstall,
)
from hybridpar.compat.versions import SUPPORTED, check_versions, matrix


def describe() -> str:
    """A report for bug reports: versions, and every fix with whether it is installed."""
    import keras
    import tensorflow as tf

    active = {fix.name for fix in known() if is_installed(fix)}
    lines = [
        f"hybridpar Keras/TF fixes (TensorFlow {tf.__version__}, Keras {keras.__version__}; "
        f"verified on {matrix()})"
    ]
    for fix in known():
        if not fix.patches and not fix.part_of:
            status = "override in hybridpar's strategies"
        else:
            status = "installed" if fix.name in active else f"not installed ({fix.group})"
            status += f", in {fix.part_of}'s patch" if fix.part_of else ""
        upstream = f" [{fix.upstream}]" if fix.upstream else ""
        lines.append(f"  {fix.name:20s} {status:36s} {fix.corrects}{upstream}")
    return "\n".join(lines)


__all__ = [
    "SUPPORTED",
    "Fix",
    "check_versions",
    "describe",
    "hold",
    "holding",
    "installed",
    "known",
    "uninstall",
]
