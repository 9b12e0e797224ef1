"""On workers other than the chief, Keras callbacks write to a private directory.

Upstream (Keras 3.15): callbacks know nothing of chiefs. Under
MultiWorkerMirroredStrategy every worker writes TensorBoard logs,
checkpoints and CSV logs to the same paths, and ``BackupAndRestore`` crashes
a worker with ``FileExistsError`` on the shared backup dir. For models under
a hybridpar strategy on a non-chief worker, TensorBoard, ModelCheckpoint and
CSVLogger write to the worker's private temporary dir instead, and
BackupAndRestore only restores (from the chief's files), never writing or
deleting.
"""

from __future__ import annotations

import os
from typing import Any

import keras

from hybridpar.compat.patching import Fix, Patch, register
from hybridpar.state import StrategyState, state_of


def _redirect_files(callback: keras.callbacks.Callback, state: StrategyState) -> None:
    """Points a Keras callback's writes at this (non-chief) worker's private dir."""
    if getattr(callback, "_hybridpar_redirected", False):
        return
    callback._hybridpar_redirected = True
    if isinstance(callback, keras.callbacks.TensorBoard):
        callback.log_dir = str(state.output_dir(callback.log_dir))
    elif isinstance(callback, keras.callbacks.ModelCheckpoint):
        path = os.path.abspath(callback.filepath)
        callback.filepath = str(state.output_dir(os.path.dirname(path)) / os.path.basename(path))
    elif isinstance(callback, keras.callbacks.CSVLogger):
        path = os.path.abspath(callback.filename)
        callback.filename = str(state.output_dir(os.path.dirname(path)) / os.path.basename(path))
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        callback._save_model = lambda: None
        callback.delete_checkpoint = False


def _off_chief(model: Any) -> StrategyState | None:
    state = state_of(getattr(model, "_distribute_strategy", None))
    return state if state is not None and not state.is_chief else None


def _on_worker(self, model) -> bool:
    return _off_chief(model) is not None


def _chief_only(original: Any) -> Any:
    def set_model(self, model):
        state = _off_chief(model)
        for callback in self.callbacks:
            _redirect_files(callback, state)
        return original(self, model)

    return set_model


FIX = register(Fix(
    name="chief_files",
    corrects="every worker writes the same TensorBoard, checkpoint and CSV files, and "
             "BackupAndRestore collides on the shared dir",
    group="core",
    patches=(Patch(keras.callbacks.CallbackList, "set_model", _chief_only,
                     owns=_on_worker),),
))
