"""PowerSGD: rank-r gradient compression with warm start and error feedback.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization" (NeurIPS 2019), Algorithms 1 and 2.
Per compressed gradient, viewed as an ``n x m`` matrix (see
``compression_plan``), each replica ``w`` of a step:

1. adds its error memory: ``M_w = G_w + E_w``;
2. ``P_w = M_w Q`` with the previous step's ``Q`` (warm start);
   ``P = sum_w P_w`` (all-reduce, batched with every uncompressed gradient);
3. orthogonalises ``P`` (reduced QR) into ``P^``;
4. ``Q_w = M_w^T P^``; ``Q = sum_w Q_w`` (all-reduce);
5. uses ``P^ Q^T`` as the summed gradient, keeps ``Q`` for the next step, and
   remembers what its own contribution missed: ``E_w = M_w - P^ Q_w^T``.

Keras sums gradients over the replicas (each replica's loss is scaled by its
share of the examples), so the all-reduces are sums and ``P^ Q^T`` is the
projection of the summed gradient onto span(``P^``); orthogonalisation makes
sum or mean irrelevant. With ``warmup_steps`` the first optimizer steps
all-reduce the exact gradients instead (``tf.cond`` on the step counter).

The error memory ``E`` is replica-local: a SyncOnRead variable per gradient
whose copy on each replica holds that replica's own values. ``Q`` is a
SyncOnRead variable too, written by every replica with the same all-reduced
value, so all replicas hold the same ``Q`` without another collective. Both
sit on the gradient's variable's devices (its model-parallel stage). A step
whose factors are not finite (an overflow) leaves ``E`` and ``Q`` unchanged
and returns the non-finite gradient, so a loss-scale optimizer sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from hybridpar.config import PowerSGDConfig
from hybridpar.parallel.all_reduce import all_reduce_sum
from hybridpar.parallel.compression_plan import GradientSpec, matrix_shape, powersgd_applies

_Q_SEED = 20190531  # the first Q of every replica and worker: the same stateless draw


def spec_of(path: str, shape: Sequence[int], dtype: Any, sparse: bool = False) -> GradientSpec:
    """The plan's view of a gradient (or variable) of ``shape`` and ``dtype``."""
    dtype = tf.as_dtype(dtype)
    return GradientSpec(name=path, shape=tuple(int(d) for d in shape), itemsize=dtype.size,
                        floating=dtype in (tf.float32, tf.float64), sparse=sparse)


def orthogonalize(p: tf.Tensor) -> tf.Tensor:
    """Orthonormal columns spanning ``p`` (n x r, n > r): the Q of its reduced QR."""
    return tf.linalg.qr(p)[0]


@dataclasses.dataclass
class _Entry:
    """The PowerSGD state of one gradient."""

    path: str
    matrix: tuple[int, int]
    error: Any  # SyncOnRead [n, m]: each replica's own error memory
    q: Any  # SyncOnRead [m, r]: the warm start, equal on every replica


def _replica_local(initial: tf.Tensor, aggregation: tf.VariableAggregation,
                   name: str) -> tf.Variable:
    return tf.Variable(initial, trainable=False, name=name,
                       synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=aggregation)


class PowerSGDState:
    """PowerSGD's error memory and warm-start factors for one optimizer's variables.

    Create it eagerly, in the strategy's scope and cross-replica context
    (``GradientCompression`` does so before the first trace, or from the first
    step through ``merge_call`` and ``tf.init_scope``).

    Args:
        strategy: the strategy the variables belong to.
        variables: the optimizer's trainable (Keras) variables.
        settings: ``communication.powersgd``.
        iterations: the optimizer's step counter (for ``warmup_steps``).
    """

    def __init__(self, strategy: tf.distribute.Strategy, variables: Sequence[Any],
                 settings: PowerSGDConfig, iterations: Any) -> None:
        self.rank = settings.rank
        self.warmup_steps = settings.warmup_steps
        self.iterations = iterations
        self.entries: dict[Any, _Entry] = {}
        self._local_replica_ids: list[int] | None = None
        for index, variable in enumerate(variables):
            value = variable.value if isinstance(variable, keras.Variable) else variable
            path = getattr(variable, "path", value.name)
            spec = spec_of(path, variable.shape, value.dtype)
            if not powersgd_applies(spec, self.rank, settings.min_elements):
                continue
            n, m = matrix_shape(spec.shape)
            with strategy.extended.colocate_vars_with(value):
                error = _replica_local(tf.zeros([n, m], value.dtype),
                                       tf.VariableAggregation.NONE, f"powersgd_error_{index}")
                q = _replica_local(
                    tf.random.stateless_normal([m, self.rank], seed=[_Q_SEED, index],
                                               dtype=value.dtype),
                    tf.VariableAggregation.ONLY_FIRST_REPLICA, f"powersgd_q_{index}")
            self.entries[value.ref()] = _Entry(path, (n, m), error, q)

    # ------------------------------------------------------------------ the all-reduce

    def reduce(self, pairs: list[tuple[Any, Any]], group: Any = None) -> list[Any]:
        """The summed gradients of one stage group's ``(gradient, variable)`` pairs, on the
        group's collectives (``all_reduce.all_reduce_sum``'s ``group``).

        Call it in replica context. Pairs whose variable is ``None`` (the
        example count) or has no PowerSGD state, and sparse gradients, are
        all-reduced exactly, in the batch of the P factors.
        """
        picked = [i for i, (gradient, variable) in enumerate(pairs)
                  if variable is not None and isinstance(gradient, tf.Tensor)
                  and variable.ref() in self.entries]
        values = [gradient for gradient, _ in pairs]
        if not picked:
            return all_reduce_sum(values, group=group)
        if not self.warmup_steps:
            return self._compressed(pairs, picked, group)
        warm = tf.convert_to_tensor(self.iterations) < self.warmup_steps
        return tf.cond(warm, lambda: all_reduce_sum(values, in_branch=True, group=group),
                       lambda: self._compressed(pairs, picked, group))

    def _compressed(self, pairs: list[tuple[Any, Any]], picked: list[int],
                    group: Any = None) -> list[Any]:
        entries = [self.entries[pairs[i][1].ref()] for i in picked]
        gradients = [pairs[i][0] for i in picked]
        exact = [i for i in range(len(pairs)) if i not in set(picked)]
        before, matrices, ps, q_before = [], [], [], []
        for gradient, entry in zip(gradients, entries, strict=True):
            with tf.device(gradient.device or None):
                before.append(entry.error.read_value())
                q_before.append(entry.q.read_value())
                matrices.append(tf.reshape(gradient, entry.matrix) + before[-1])
                ps.append(tf.matmul(matrices[-1], q_before[-1]))
        first = all_reduce_sum(ps + [pairs[i][0] for i in exact], in_branch=True, group=group)
        p_sums, exact_sums = first[:len(ps)], first[len(ps):]
        p_hats, q_locals = [], []
        for gradient, matrix, p_sum in zip(gradients, matrices, p_sums, strict=True):
            with tf.device(gradient.device or None):
                p_hats.append(orthogonalize(p_sum))
                q_locals.append(tf.matmul(matrix, p_hats[-1], transpose_a=True))
        q_sums = all_reduce_sum(q_locals, in_branch=True, group=group)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in p_sums + q_sums])
        updates, approximations = [], []
        for k, (gradient, entry) in enumerate(zip(gradients, entries, strict=True)):
            with tf.device(gradient.device or None):
                missed = matrices[k] - tf.matmul(p_hats[k], q_locals[k], transpose_b=True)
                updates.append(entry.error.assign(tf.where(finite, missed, before[k])))
                updates.append(entry.q.assign(tf.where(finite, q_sums[k], q_before[k])))
                approximation = tf.matmul(p_hats[k], q_sums[k], transpose_b=True)
                approximations.append(tf.reshape(approximation, tf.shape(gradient)))
        with tf.control_dependencies(updates):
            approximations = [tf.identity(a) for a in approximations]
        reduced: list[Any] = [None] * len(pairs)
        for index, value in zip(picked + exact, approximations + exact_sums, strict=True):
            reduced[index] = value
        return reduced

    # ------------------------------------------------------------------ checkpoints

    def tensors(self, replicas: int) -> list[tuple[str, tuple[int, ...], str]]:
        """Path, shape and dtype of what ``capture`` returns: per gradient, the error
        memory of all ``replicas`` stacked, then ``Q``."""
        found = []
        for entry in self.entries.values():
            dtype = entry.error.dtype.name
            rows, columns = entry.matrix
            found.append((f"powersgd/{entry.path}/error", (replicas, rows, columns), dtype))
            found.append((f"powersgd/{entry.path}/q", (columns, self.rank), dtype))
        return found

    def local_errors(self, strategy: tf.distribute.Strategy) -> list[list[tuple[int, Any]]]:
        """Per gradient, this worker's replicas' error memories: ``(replica id, variable)``.

        The replica id is the replica's index in the sync group (its row of
        the stacked tensor ``tensors`` describes); nothing crosses workers.
        """
        if self._local_replica_ids is None:  # found once: a traced function per call retraces
            ids = tf.function(lambda: strategy.run(
                lambda: tf.distribute.get_replica_context().replica_id_in_sync_group))()
            self._local_replica_ids = [int(t) for t in strategy.experimental_local_results(ids)]
        return [list(zip(self._local_replica_ids, strategy.experimental_local_results(entry.error),
                         strict=True))
                for entry in self.entries.values()]

    def local_qs(self, strategy: tf.distribute.Strategy) -> list[tuple[Any, ...]]:
        """Per gradient, ``Q`` on each of this worker's replicas (equal on every replica)."""
        return [strategy.experimental_local_results(entry.q) for entry in self.entries.values()]
