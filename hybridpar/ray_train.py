"""Ray Train: report hybridpar's epoch metrics and checkpoints to ``ray.train.report``.

Inside ``TensorflowTrainer``'s ``train_loop_per_worker``, ``hybridpar.scope()``
already trains in ``multi_worker`` mode (Ray sets ``TF_CONFIG``), and Ray's
``FailureConfig`` restarts resume from hybridpar's own checkpoints in
``checkpoint.dir``. ``RayTrainReport`` also lets Ray's checkpoint manager and
dashboard see them::

    with hybridpar.scope(config) as hs:
        model = build(); model.compile(...)
    model.fit(data, epochs=3, callbacks=[*hs.callbacks(), hybridpar.ray_train.RayTrainReport(hs)])

Every worker reports each epoch's metrics (Ray Train needs all workers to
report equally often) and the chief attaches the newest hybridpar checkpoint
when there is one it has not reported yet; ``fit``'s end makes one more
report, with the final checkpoint. Needs the ``ray`` extra.
"""

from __future__ import annotations

from typing import Any

import keras

from hybridpar.checkpoint.files import latest


class RayTrainReport(keras.callbacks.Callback):
    """Calls ``ray.train.report`` at every epoch end and once when ``fit`` ends.

    Args:
        hybrid: the ``HybridStrategy`` of the scope the model was built in
            (its ``checkpoint.dir`` and chief).
    """

    def __init__(self, hybrid: Any) -> None:
        super().__init__()
        import ray.train

        self._train = ray.train
        self._directory = hybrid.config.checkpoint.dir
        self._is_chief = hybrid.is_chief
        self._reported: str | None = None
        self._last: dict[str, float] = {}

    def _new_checkpoint(self) -> Any:
        if not self._is_chief or self._directory is None:
            return None
        found = latest(self._directory)
        if found is None or str(found.path) == self._reported:
            return None
        self._reported = str(found.path)
        return self._train.Checkpoint.from_directory(str(found.path))

    def _report(self, metrics: dict[str, float]) -> None:
        metrics = {**metrics, "step": int(self.model.optimizer.iterations.numpy())}
        self._train.report(metrics, checkpoint=self._new_checkpoint())

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._last = {name: float(value) for name, value in (logs or {}).items()}
        self._report({**self._last, "epoch": epoch + 1})

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._report({**self._last, "final": 1.0})
