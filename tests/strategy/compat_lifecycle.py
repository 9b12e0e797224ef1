"""When hybridpar's Keras/TF patches are in place, in a fresh process (prints one JSON line).

    python compat_lifecycle.py

Records every patched attribute before hybridpar builds anything, then which
groups of fixes are installed while a staged strategy, a ``hybridpar.stage()``
block and the parameter-server hold exist, after they are gone, and after
``hybridpar.compat.uninstall()``. The staged model has a synchronized batch norm: its
all-reduces must not keep the strategy (and so the fixes) alive either.
tests/strategy/test_compat_scoping.py reads it.
"""

import gc
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import hybridpar
from hybridpar import compat

hybridpar.testing.use_logical_cpus(4)

MISSING = object()
FIXES = [fix for fix in compat.known() if fix.patches]
ORIGINALS = {(fix.name, i): vars(p.owner).get(p.name, MISSING)
             for fix in FIXES for i, p in enumerate(fix.patches)}


def replaced() -> dict[str, bool]:
    """For each fix with patches: whether every one of its attributes differs from the original."""
    return {fix.name: all(vars(p.owner).get(p.name, MISSING) is not ORIGINALS[(fix.name, i)]
                          for i, p in enumerate(fix.patches)) for fix in FIXES}


def all_original() -> bool:
    return all(vars(p.owner).get(p.name, MISSING) is ORIGINALS[(fix.name, i)]
               for fix in FIXES for i, p in enumerate(fix.patches))


def staged_fit() -> tuple:
    config = {"data_parallel": {"mode": "mirrored"},
              "model_parallel": {"stages": 2, "placement": {"^second$": 1}}}
    with hybridpar.scope(config) as hs:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
                                  keras.layers.BatchNormalization(synchronized=True),
                                  keras.layers.Dense(1, name="second")])
        model.compile("sgd", "mse")
    model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=8, epochs=1, verbose=0)
    return hs, model


result = {"before": all_original(), "groups": {f.name: f.group for f in FIXES}}
hs, model = staged_fit()
with hybridpar.scope({"data_parallel": {"mode": "none"}}), hybridpar.stage(0):
    result["inside_stage_block"] = replaced()
result["staged_alive"] = replaced()
del hs, model
gc.collect()
result["after_gc"] = replaced()
with compat.holding("parameter_server"), compat.holding("split_weights"):
    hs, model = staged_fit()
    with hybridpar.stage(1):
        result["everything_held"] = replaced()
        compat.uninstall()
        result["uninstalled"] = all_original()
    result["uninstalled_after_release"] = all_original()
del hs, model
gc.collect()
result["after_release_and_gc"] = all_original()
hs, model = staged_fit()
result["reinstalled"] = replaced()
print(json.dumps(result), flush=True)
