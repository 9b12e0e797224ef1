"""The data position and the save policies of PeriodicCheckpoint, on fakes (no TensorFlow)."""

import logging
import types

from hybridpar.checkpoint.policy import ParameterServerPolicy, SynchronousPolicy, policy_for
from hybridpar.checkpoint.position import DataPosition


class Model:
    def __init__(self, steps_per_execution=1):
        self.steps_per_execution = steps_per_execution
        self.trained = []
        self.train_function = self.trained.append


class Watcher:
    def __init__(self):
        self.steps = 0

    def step_done(self):
        self.steps += 1


def test_the_position_counts_each_iterator_and_notices_one_that_spans_epochs():
    epoch, drawn = [0], []
    position = DataPosition(lambda it, n: drawn.append((it, n)), lambda: epoch[0], lambda: None)
    model = Model(steps_per_execution=2)
    original = model.train_function
    position.install(model)
    first = object()
    model.train_function(first)
    model.train_function(first)
    assert position.record(0, 4) == {"epoch": 0, "batch": 4, "iterator_position": 4,
                                     "iterator_persists": False}
    epoch[0] = 1
    model.train_function(first)  # the same iterator in the next epoch
    assert position.record(1, 2)["iterator_position"] == 6
    assert position.record(1, 2)["iterator_persists"] is True
    model.train_function(object())  # a fresh iterator
    assert position.record(1, 2) == {"epoch": 1, "batch": 2, "iterator_position": 2,
                                     "iterator_persists": False}
    assert model.trained == [first] * 3 + [model.trained[-1]] and drawn == []
    position.uninstall()
    assert model.train_function == original


def test_a_resume_draws_every_skipped_batch_at_the_first_call():
    drawn = []
    position = DataPosition(lambda it, n: drawn.append(n), lambda: 2, lambda: None)
    model = Model(steps_per_execution=2)
    position.install(model)
    position.skip(4, 3, persists=True)
    assert position.skipping
    iterator = object()
    assert model.train_function(iterator) == {} and drawn == [7]
    assert model.train_function(iterator) == {} and model.trained == []
    model.train_function(iterator)
    assert not position.skipping and drawn == [7] and model.trained == [iterator]
    assert position.record(2, 5)["iterator_position"] == 9


class RestoredIterator:
    """Counts the train calls that ran through ``first_step_after_restore``."""

    def __init__(self) -> None:
        self.checked = 0

    def first_step_after_restore(self, step):
        self.checked += 1
        return step(self)


def test_a_resume_restores_the_saved_iterator_instead_of_drawing():
    drawn, restored = [], []
    position = DataPosition(lambda it, n: drawn.append(n), lambda: 2, lambda: None)
    model = Model(steps_per_execution=2)
    position.install(model)
    position.skip(4, 3, persists=True, restore=lambda it: restored.append(it) or True,
                  loop_skips=True)
    iterator = RestoredIterator()
    model.train_function(iterator)  # the loop began the epoch at batch 4: this one trains
    assert restored == [iterator] and drawn == [] and model.trained == [iterator]
    assert iterator.checked == 1  # the first step after the restore checks the input goes on
    model.train_function(iterator)
    assert iterator.checked == 1 and model.trained == [iterator] * 2
    assert not position.skipping
    assert position.record(2, 8)["iterator_position"] == 11
    assert position.live_iterator(2) is iterator


def test_a_state_that_cannot_be_restored_is_drawn_instead():
    drawn = []
    position = DataPosition(lambda it, n: drawn.append(n), lambda: 0, lambda: None)
    model = Model()
    position.install(model)
    position.skip(5, 0, persists=False, restore=lambda it: False)
    iterator = object()
    assert model.train_function(iterator) == {} and drawn == [5]  # 5 calls train nothing


def test_a_save_records_the_live_iterator_only_for_its_epoch():
    epoch = [0]
    position = DataPosition(lambda it, n: None, lambda: epoch[0], lambda: None)
    model = Model()
    position.install(model)
    assert position.live_iterator(0) is None  # nothing drawn yet: a fresh iterator
    iterator = object()
    model.train_function(iterator)
    assert position.live_iterator(0) is iterator
    assert position.live_iterator(1) is None  # the next epoch draws a fresh iterator
    epoch[0] = 1
    model.train_function(iterator)  # unless this one spans epochs
    assert position.live_iterator(1) is iterator


def test_a_synchronous_resume_has_the_loop_begin_inside_the_epoch():
    policy = SynchronousPolicy(lambda **kw: None, lambda: 1, lambda it, n: None,
                               coordinated=False)
    model, starts = Model(), []
    policy.begin(model)
    data = {"epoch": 1, "batch": 6, "iterator_position": 6, "iterator_persists": False}
    resume = policy.resume(model, {"data": data}, 13, lambda it: True,
                           lambda batch: starts.append(batch) or True)
    assert starts == [6] and (resume.epoch, resume.batch, resume.inside) == (1, 6, True)
    cannot = policy.resume(model, {"data": data}, 13, None, lambda batch: False)
    assert cannot.batch == 0  # the loop calls the train function for every step then


def test_a_synchronous_epoch_save_waits_for_the_next_step_or_the_end():
    saves, due = [], []
    policy = SynchronousPolicy(lambda **kw: saves.append(kw), lambda: 0, lambda it, n: None,
                               coordinated=False)
    model = Model()
    policy.begin(model)
    policy.epoch_ended()
    assert saves == []
    model.train_function(object())
    assert saves == [{}]
    policy.epoch_ended()
    policy.flush()
    policy.flush()
    assert saves == [{}, {}]
    watcher = Watcher()
    policy.step_begins(watcher)
    policy.step_ended(watcher, lambda: due.append(watcher.steps))
    assert due == [0] and watcher.steps == 1  # the step save comes before the step counts
    policy.end()


def test_parameter_server_saves_epochs_at_once_and_resumes_inside_them(caplog):
    saves = []
    with caplog.at_level(logging.WARNING, logger="hybridpar"):
        policy = ParameterServerPolicy(lambda **kw: saves.append(kw), every_steps=5)
    assert "every_steps=5 is not applied" in caplog.text
    policy.epoch_ended()
    assert saves == [{"wait": True}]
    watcher = Watcher()
    policy.step_begins(watcher)
    policy.step_ended(watcher, lambda: saves.append("due"))
    assert watcher.steps == 1 and saves == [{"wait": True}]
    assert policy.data(1, 10, 20) == {"epoch": 1, "batch": 10, "iterator_position": 10,
                                      "iterator_persists": False, "steps_per_epoch": 20}
    model = Model()
    resume = policy.resume(model, {"data": policy.data(1, 10, 20)}, 20)
    assert (resume.epoch, resume.batch, resume.inside) == (1, 10, True)
    assert model._hybridpar_initial_batch == 10 and resume.where.startswith(", inside epoch 2")


def test_the_policy_follows_the_strategy():
    def state(mode, workers):
        return types.SimpleNamespace(mode=mode, cluster=types.SimpleNamespace(num_workers=workers))

    def choose(s):
        return policy_for(s, print, lambda: 0, lambda it, n: None, 0)

    assert isinstance(choose(None), SynchronousPolicy) and not choose(None).coordinated
    assert choose(state("multi_worker", 2)).coordinated
    assert not choose(state("mirrored", 1)).coordinated
    ps = choose(state("parameter_server", 2))
    assert isinstance(ps, ParameterServerPolicy) and not ps.coordinated and not ps.deep
