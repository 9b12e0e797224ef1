"""Checkpoints of ZeRO's sharded optimizer state (shard_optimizer_state) on 4 logical CPUs.

Each replica's shard of a slot is stored as slices of the slot an unsharded optimizer
has (same key, path and shape), so a checkpoint restores onto another replica count,
onto an unsharded run and onto one device, and an unsharded one onto a sharded run.
"""

import keras
import numpy as np
import pytest
from model_checks import Crash
from test_checkpoints_in_one_process import EPOCHS, build, dataset

import hybridpar
from hybridpar.checkpoint import export, model_state
from hybridpar.errors import CheckpointMismatchError

pytestmark = pytest.mark.strategy

DEVICES = [f"/cpu:{i}" for i in range(4)]


STAGES = {"stages": 2, "placement": {"^hidden$": 0, "^out$": 1}}


def config(directory, replicas: int, shard: bool, stages: int = 1) -> dict:
    """``replicas`` x ``stages`` over the first ``replicas * stages`` logical CPUs."""
    parallel = {"mode": "none"} if replicas == 1 else {
        "mode": "mirrored", "devices": DEVICES[:replicas * stages],
        "shard_optimizer_state": shard}
    checkpoint = {} if directory is None else {
        "checkpoint": {"dir": str(directory), "every_steps": 4, "keep": 2}}
    staged = {"model_parallel": STAGES} if stages > 1 else {}
    return {"data_parallel": parallel, "data": {"global_batch_size": 16}, **checkpoint,
            **staged}


def train(directory, replicas=4, shard=True, crash_at=None, hidden=16, epochs=EPOCHS,
          stages=1):
    keras.utils.set_random_seed(3)
    with hybridpar.scope(config(directory, replicas, shard, stages)) as hs:
        model = build(hidden)
        callbacks = hs.callbacks()
    extra = [Crash(crash_at)] if crash_at else []
    try:
        model.fit(dataset(), epochs=epochs, callbacks=callbacks + extra, shuffle=False,
                  verbose=0)
    finally:
        callbacks[0].writer.wait()
    return model, hs, callbacks[0]


def built(replicas: int, shard: bool, stages: int = 1):
    """A model as ``train`` builds it, with its optimizer built, not trained."""
    with hybridpar.scope(config(None, replicas, shard, stages)) as hs:
        model = build()
    model_state.ensure_built(model)
    return model, hs


def slots(model, hs) -> list[np.ndarray]:
    """The optimizer's slots as an unsharded optimizer holds them, joined from the shards."""
    sharding = hs.state.zero if hs.state is not None else None
    if sharding is None:
        return [v.numpy() for v in model.optimizer.variables if v.shape.rank]
    joined = []
    for slot in sharding.state_for(model.optimizer).checkpoint_slots():
        flat = np.full(int(np.prod(slot.shape)), np.nan, "float32")
        for variable, piece in slot.parts:
            flat[piece.start:piece.start + piece.length] = (
                variable.numpy()[piece.shard_offset:piece.shard_offset + piece.length])
        joined.append(flat.reshape(slot.shape))
    return joined


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def test_a_resumed_sharded_run_ends_like_an_uninterrupted_one(tmp_path):
    reference, hr, _ = train(tmp_path / "reference")
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed", crash_at=19)
    resumed, hs, callback = train(tmp_path / "resumed")
    assert callback.restored.step == 16
    assert hs.state.zero is not None and hs.num_replicas == 4
    assert int(resumed.optimizer.iterations.numpy()) == EPOCHS * 13
    assert max_diff(resumed.get_weights(), reference.get_weights()) <= 1e-5
    assert max_diff(slots(resumed, hs), slots(reference, hr)) <= 1e-5


def topology(replicas: int, shard: bool, stages: int = 1) -> dict:
    return {"replicas": replicas, "shard": shard, "stages": stages}


@pytest.mark.parametrize("source, target", [
    ((4, True), (2, True)),  # re-cut onto another replica count
    ((4, True), (4, False)),  # onto an unsharded strategy
    ((4, True), (1, False)),  # onto one device
    ((4, False), (4, True)),  # an unsharded checkpoint onto a sharded run
    ((2, True, 2), (4, True)),  # a 2 x 2 hybrid's per-stage shards onto 4 replicas
    ((4, True), (2, True, 2)),  # and 4 replicas' shards onto each stage group of a hybrid
])
def test_a_checkpoint_restores_its_slots_onto_another_sharding(source, target, tmp_path):
    trained, hs, _ = train(tmp_path / "ckpt", **topology(*source), epochs=1)
    model, ht = built(**topology(*target))
    found = hybridpar.checkpoint.restore(model, tmp_path / "ckpt")
    assert found.step == 13
    assert int(model.optimizer.iterations.numpy()) == 13
    assert max_diff(model.get_weights(), trained.get_weights()) == 0.0
    restored, saved = slots(model, ht), slots(trained, hs)
    assert len(restored) == 2 * len(trained.trainable_variables)  # Adam's m and v
    assert max_diff(restored, saved) == 0.0


def test_sharded_slots_equal_the_unsharded_optimizers(tmp_path):
    """The slots a sharded run stores are an unsharded run's m and v (<= 1e-5)."""
    train(tmp_path / "sharded", epochs=1)
    unsharded, hu, _ = train(tmp_path / "unsharded", shard=False, epochs=1)
    model, hm = built(1, False)
    hybridpar.checkpoint.restore(model, tmp_path / "sharded")
    assert max_diff(slots(model, hm), slots(unsharded, hu)) <= 1e-5


def test_a_checkpoint_with_other_shapes_names_the_variables(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=5)
    with pytest.raises(CheckpointMismatchError, match=(
            r"sequential(_\d+)?/hidden/kernel \(8, 32\) float32 in this model, "
            r"sequential(_\d+)?/hidden/kernel \(8, 16\) float32 in the checkpoint")):
        train(tmp_path / "ckpt", hidden=32)


def test_a_damaged_sharded_checkpoint_falls_back_to_the_previous(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "ckpt", crash_at=19)
    state = tmp_path / "ckpt" / "ckpt-00000016" / "state.data-00000-of-00001"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    reference, hr, _ = train(tmp_path / "reference")
    resumed, hs, callback = train(tmp_path / "ckpt")
    assert callback.restored.step == 13
    assert max_diff(resumed.get_weights(), reference.get_weights()) <= 1e-5
    assert max_diff(slots(resumed, hs), slots(reference, hr)) <= 1e-5


def test_export_gives_plain_keras_the_full_unsharded_optimizer_state(tmp_path):
    trained, hs, _ = train(tmp_path / "ckpt", epochs=1)
    exporter, _ = built(1, False)
    hybridpar.checkpoint.export_weights(tmp_path / "ckpt", exporter, tmp_path / "m.weights.h5")
    # the command rebuilds the model, compiled with its Adam, from the manifest
    assert export.main(["export", str(tmp_path / "ckpt"), "--to",
                        str(tmp_path / "cli.weights.h5")]) == 0
    for exported in ("m.weights.h5", "cli.weights.h5"):
        plain = build()  # plain Keras: no hybridpar scope
        plain.optimizer.build(plain.trainable_variables)
        plain.load_weights(tmp_path / exported)
        assert int(plain.optimizer.iterations.numpy()) == 13
        assert max_diff(plain.get_weights(), trained.get_weights()) == 0.0
        assert max_diff([v.numpy() for v in plain.optimizer.variables if v.shape.rank],
                        slots(trained, hs)) == 0.0
