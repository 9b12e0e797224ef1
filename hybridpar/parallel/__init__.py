"""hybridpar's own parallel machinery: collectives, stages, pipelining, compression.

``all_reduce`` is the replica all-reduce every hybridpar collective goes
through (no registered gradient, one batch per dtype, launchable inside a
``tf.cond``), and ``moving_statistics`` averages batch norm's per-replica
copies with it. ``staging`` says where each stage's variables and ops go,
``pipeline`` is the microbatched train step, ``weight_gradients`` its
once-per-batch weight gradients, ``timeline`` records the schedule a few steps
ran, and ``schedule`` (pure Python) measures and draws it. ``compression``,
``powersgd`` and ``compression_plan`` (pure Python) compress gradients.
Nothing here imports ``hybridpar.compat``; the fixes there call into it.
"""
