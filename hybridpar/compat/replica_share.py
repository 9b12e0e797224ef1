"""Each replica's loss is weighted by its share of the step's examples.

Upstream (Keras 3.15, ``keras/src/losses/loss.py``,
``scale_loss_for_distribution``): a replica's mean loss is scaled by
``1 / num_replicas``, which is right only when every replica holds the same
number of examples. On a final partial batch the step's gradient is
misweighted and distributed training drifts from single-device training
(about 1e-2 in the weights after 2 epochs here).

hybridpar's mirrored and multi-worker strategies run every replica function
inside ``weighted_by_share`` (an override of ``_call_for_each_replica``), so
this holds for Keras's ``train_step`` and for a model's own one alike. When
the batch's leading size is dynamic, each replica's loss is scaled by
``local / total`` instead, and the loss tracker is unscaled by the same
share so progress bars stay exact. Static batch sizes need nothing: every
replica then holds the same number of examples.

``total`` is free when ``data.global_batch_size`` (``B``) is set: the loss is
scaled by ``local / B`` and the true total rides along in the gradient
all-reduce Keras already does (``gradient_all_reduce``), which rescales the
sums by ``B / total``. Without it, the first loss scaled in a replica
function all-reduces the local counts once (one scalar collective per step).

A replica's piece of a split batch (``hybridpar.data.balanced.ReplicaBatch``,
from ``even_batches``) counts only the examples it keeps: a replica that holds
only padding has a share of 0, so its loss adds nothing to the gradients,
whatever ``train_step`` computes it. The replica function receives the piece's
data as the dataset yields it; hybridpar's own steps (``padded_steps``) read
the keep mask from the share to weight their metrics and outputs.

Each output's loss figure (``CompileLoss.call``, ``compile_utils.py``) is a
``Mean`` that Keras updates with the replica's mean loss and the weight
``y_pred.shape[0]``, which is ``None`` for a dynamic batch: one device counts each
batch once, a strategy counts each replica once, so on uneven pieces (or padding)
the figure averages the replicas' means instead of the batch's (upstream, with or
without hybridpar). In a weighted replica that record is ``records * examples /
total`` times the mean (``output_record``), so the replicas' records of a batch add
up to ``records`` batch means over ``records`` counts: one device's figure.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from keras.src import tree
from keras.src.losses import loss as keras_loss
from keras.src.trainers import compile_utils
from keras.src.trainers.data_adapters import data_adapter_utils

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.data import balanced
from hybridpar.parallel import all_reduce as replica_all_reduce
from hybridpar.parallel import output_records


@dataclasses.dataclass
class Share:
    """One replica's example count and the step's total (all-reduced when first needed).

    Attributes:
        local: the examples this replica holds (padding not counted).
        nominal: ``data.global_batch_size``, or ``None``.
        keep: the replica's keep mask when its batch is a balanced piece (1.0
            for the input's examples, 0.0 for padding), else ``None``.
    """

    local: tf.Tensor
    nominal: float | None
    keep: tf.Tensor | None = None
    _total: tf.Tensor | None = None
    _examples: tf.Tensor | None = None

    def total(self) -> tf.Tensor:
        """What each replica's loss is divided by: the nominal batch, else ``examples()``."""
        if self._total is None:
            self._total = tf.constant(self.nominal) if self.nominal is not None else (
                self.examples())
        return self._total

    def examples(self) -> tf.Tensor:
        """The step's examples over every replica (one scalar all-reduce, when first asked)."""
        if self._examples is None:
            (self._examples,) = replica_all_reduce.all_reduce_sum([self.local])
        return self._examples


_share: contextvars.ContextVar[Share | None] = contextvars.ContextVar(
    "hybridpar_replica_share", default=None
)


# True inside CompileLoss.call, whose only unscaling is of each output's loss record.
_recording: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "hybridpar_recording_output_losses", default=False
)


def current_share() -> Share | None:
    """The share of the replica function running now, if hybridpar weights it."""
    return _share.get()


def current_keep() -> tf.Tensor | None:
    """The keep mask of the running replica's padded piece, or ``None`` (no padding)."""
    share = _share.get()
    return None if share is None else share.keep


def _dynamic_batch(args: tuple[Any, ...]) -> tf.Tensor | None:
    """The first input tensor of a replica function's batch, if its leading size is dynamic."""
    if not args:
        return None
    try:
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(args[0])
    except ValueError:  # not a Keras batch (a tuple of more than 3 parts)
        return None
    first = next((t for t in tree.flatten(x) if isinstance(t, tf.Tensor)), None)
    if first is None or first.shape.rank in (None, 0) or first.shape[0] is not None:
        return None
    return first


@contextlib.contextmanager
def _sharing(share: Share | None) -> Iterator[None]:
    if share is None:
        yield
        return
    token = _share.set(share)
    try:
        yield
    finally:
        _share.reset(token)


def _share_of(args: tuple[Any, ...], nominal: int | None) -> Share | None:
    context = tf.distribute.get_replica_context()
    first = _dynamic_batch(args) if context is not None else None
    if first is None or context.num_replicas_in_sync == 1:
        return None
    local = tf.cast(tf.shape(first)[0], tf.float32)
    return Share(local, None if nominal is None else float(nominal))


def weighted_by_share(fn: Callable[..., Any], nominal: int | None,
                      guard_empty: bool = False) -> Callable[..., Any]:
    """``fn`` (a replica function) run with its batch's share of the examples.

    Args:
        fn: what ``strategy.run`` runs in each replica.
        nominal: ``data.global_batch_size``, or ``None``.
        guard_empty: give a replica whose piece is empty (its worker's input
            ended before another's) one zero example with keep 0 instead.
    """

    @functools.wraps(fn)
    def replica_fn(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], balanced.ReplicaBatch):
            piece = balanced.zero_row_if_empty(args[0]) if guard_empty else args[0]
            nominal_size = None if nominal is None else float(nominal)
            share = Share(tf.reduce_sum(piece.keep), nominal_size, keep=piece.keep)
            with _sharing(share):
                return fn(piece.data, *args[1:], **kwargs)
        with _sharing(_share_of(args, nominal)):
            return fn(*args, **kwargs)

    return replica_fn


def _in_weighted_replica(*args: Any, **kwargs: Any) -> bool:
    return _share.get() is not None


def _scaled_by_share(invert: bool) -> Callable[[Any], Any]:
    def wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def scale(value):
            share = _share.get()
            total = share.total()
            if invert and _recording.get():
                factor = _output_record_factor(share, *(output_records.current() or (None, 1)))
            elif invert:
                factor = tf.math.divide_no_nan(total, share.local)
            else:
                factor = share.local / total
            return value * tf.cast(factor, value.dtype)

        return scale

    return wrap


def _output_record_factor(share: Share, examples: tf.Tensor | None, records: int) -> Any:
    """What turns a loss scaled by ``local / total`` into its output-loss record:
    ``replicas * records * examples / step examples`` times the record's mean."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    examples = share.local if examples is None else tf.cast(examples, tf.float32)
    scaled = float(replicas * records) * examples * share.total()
    return tf.math.divide_no_nan(scaled, share.examples() * share.local)


def _recording_output_losses(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(self, *args, **kwargs):
        token = _recording.set(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _recording.reset(token)

    return call


FIX = register(Fix(
    name="replica_share",
    corrects="a replica's loss is scaled by 1/replicas, misweighting partial batches, and "
             "each output's loss figure averages the replicas' means, not the batch's",
    group="core",
    patches=(
        Patch(keras_loss, "scale_loss_for_distribution", _scaled_by_share(invert=False),
              owns=_in_weighted_replica),
        Patch(keras_loss, "unscale_loss_for_distribution", _scaled_by_share(invert=True),
              owns=_in_weighted_replica),
        Patch(compile_utils.CompileLoss, "call", _recording_output_losses,
              owns=_in_weighted_replica),
    ),
))
