"""hybridpar's own subclasses of the ``tf.distribute`` strategies, and the runtimes behind them.

Each class derives from the ``tf.distribute`` class it extends (so
``isinstance`` checks in user code keep working) and from
``hybridpar.state.OwnedStrategy``, and carries one ``StrategyState``:

- ``mirrored``: one device (``mode: none``) and ``MirroredStrategy``;
- ``multi_worker``: ``MultiWorkerMirroredStrategy``; ``cluster_join`` brings
  the task into its cluster when ``hybridpar`` is imported;
- ``parameter_server``: ``ParameterServerStrategy`` and its servers;
  ``ps_training`` runs ``fit``/``evaluate``/``predict`` on the chief;
- ``evaluator``: sidecar evaluation on the evaluator task;
- ``build``: the strategy a config asks for.

The overrides those classes make of ``tf.distribute`` behaviour, one module
per upstream behaviour (their fix records are in ``hybridpar.compat.overrides``):
``collective_keys``, ``collective_restart``, ``even_batches``,
``staged_variables``, ``ps_chief`` and ``ps_evaluator_job``.
"""
