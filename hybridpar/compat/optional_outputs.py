"""A training step returns its logs, not an Optional that costs two eager ops to open.

Upstream (Keras 3.15, ``TensorFlowTrainer._make_function`` in
``keras/src/backend/tensorflow/trainer.py``): the traced
``multi_step_on_iterator`` wraps every step's logs in a
``tf.experimental.Optional`` (needed only for ``steps_per_execution > 1``,
where the data may end inside an execution), and after every call the
Python loop runs ``has_value()`` and ``get_value()`` eagerly: two op
dispatches per step, about 0.3 ms of a 6.5 ms multi-worker step measured
here. With ``steps_per_execution == 1`` the Optional always holds a value
(the end of the data is an ``OutOfRangeError`` from ``get_next``, which
Keras's epoch iterator turns into the end of the epoch).

For models under a strategy hybridpar built, the trainer's
``_make_function`` (``hybridpar.training``, through ``trainer_hooks``) builds
the train and test functions with ``make_function``: with ``steps_per_execution == 1`` the traced
function returns the logs themselves; with more, the loop of
``step_loop`` runs; under replicated strategies, ``jit_compile=True`` goes
through ``xla_replicas``. Everything else, and every model of another
strategy, uses Keras's own ``_make_function``. ``run_eagerly`` models and
the chief-side ``evaluate`` of parameter-server mode keep Keras's path too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hybridpar.compat import step_loop, xla_replicas
from hybridpar.compat.patching import Fix, register
from hybridpar.data import resumable

_ITERATORS = (tf.data.Iterator, tf.distribute.DistributedIterator)


def make_function(model: Any, step_function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Keras's train/test function of ``model`` for a strategy hybridpar built (see module doc).

    A resumable training input (``hybridpar.data.resumable``) is traced as its host
    iterator and layout, the step drawing its replicas' pieces itself.
    """
    one_step = xla_replicas.one_step_on_data(model, step_function)
    if model.steps_per_execution == 1:

        @tf.autograph.experimental.do_not_convert
        def on_iterator(iterator):
            return one_step(iterator.get_next())
    else:
        on_iterator = step_loop.multi_step_on_iterator(model, one_step)

    @tf.autograph.experimental.do_not_convert
    def on_host(host, layout):
        return on_iterator(resumable.StepInput(model.distribute_strategy, host, layout))

    traced = tf.function(on_iterator, reduce_retracing=True)
    traced_on_host = tf.function(on_host, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, resumable.ResumableIterator):
            return traced_on_host(iterator.host, iterator.layout)
        if isinstance(iterator, _ITERATORS):
            return traced(iterator)
        for _, data in zip(range(model.steps_per_execution), iterator, strict=False):
            outputs = one_step(data)
        return outputs

    return function


FIX = register(Fix(
    name="optional_outputs",
    corrects="every training step's logs come back in a tf.experimental.Optional opened by "
             "two eager ops",
    group="core",
    part_of="trainer_hooks",
))
