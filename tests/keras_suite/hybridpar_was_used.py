"""A pytest plugin: before any test runs, use hybridpar and leave it, keeping every fix installed.

It builds and trains a model under a hybridpar scope with ``model_parallel.stages: 2``
(installing the core and stage fixes), keeps the strategy and model alive, and
holds the parameter-server fixes too, so every patch hybridpar
has stays in place while the tests of the installed Keras run. ``test_keras_suite.py``
runs those tests with and without this plugin and compares the outcomes.
"""

import contextlib

_kept = contextlib.ExitStack()


def pytest_configure(config):
    import keras
    import numpy as np

    import hybridpar
    from hybridpar import compat

    hybridpar.testing.use_logical_cpus(2)
    scope = {"data_parallel": {"mode": "mirrored"},
             "model_parallel": {"stages": 2, "placement": {"^second$": 1}}}
    with hybridpar.scope(scope) as hs:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
                                  keras.layers.Dense(1, name="second")])
        model.compile("adam", "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=8, epochs=1, verbose=0)
    _kept.enter_context(compat.holding("parameter_server"))
    _kept.enter_context(compat.holding("split_weights"))
    _kept.callback(lambda kept=(hs, model): kept)
    installed = sorted(fix.name for fix in compat.installed())
    config.stash_hybridpar_fixes = installed
    print(f"hybridpar fixes installed for the Keras tests: {', '.join(installed)}")
