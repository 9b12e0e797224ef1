"""hybridpar.compat.patching on plain Python objects: the ownership guard and registration.

``patching.py`` imports only the standard library; it is loaded from its file
so these tests import neither Keras nor TensorFlow (``hybridpar.compat``'s
package imports every fix).
"""

import importlib.util
import pathlib
import sys

import pytest

PATCHING = pathlib.Path(__file__).resolve().parents[2] / "hybridpar" / "compat" / "patching.py"


def load_patching():
    spec = importlib.util.spec_from_file_location("patching_under_test", PATCHING)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


patching = load_patching()


class Owned:
    mine = True


class Trainer:
    def step(self, data, force=False):
        """Keras's step."""
        return ("original", self, data, force)


def _owned_step(original):
    def step(self, data, force=False):
        return ("owned", original(self, data, force))

    return step


@pytest.fixture
def registry(monkeypatch):
    """A registry of its own, so nothing here reaches hybridpar's fixes."""
    fresh = patching._Registry()
    monkeypatch.setattr(patching, "_registry", fresh)
    yield fresh
    fresh.uninstall()


def test_the_guard_calls_the_original_with_the_same_arguments_for_others():
    calls = []
    sentinel = object()

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return sentinel

    replacement = patching.guarded(_owned_step, lambda *a, **k: False)(original)
    data = object()
    assert replacement("self", data, force=sentinel) is sentinel
    assert calls == [(("self", data), {"force": sentinel})]
    assert calls[0][0][1] is data


def test_the_guard_runs_the_patch_for_what_it_owns():
    replacement = patching.guarded(_owned_step, lambda self, *a, **k: self.mine)(Trainer.step)
    owned = Owned()
    assert replacement(owned, 1) == ("owned", ("original", owned, 1, False))
    assert replacement.__name__ == "step" and replacement.__doc__ == "Keras's step."
    assert replacement.__wrapped__ is Trainer.step


def test_the_guard_refuses_what_is_not_a_plain_function():
    with pytest.raises(TypeError, match="plain functions"):
        patching.guarded(_owned_step, lambda *a, **k: True)(staticmethod(len))


def test_a_guarded_patch_is_installed_and_removed(registry):
    original = vars(Trainer)["step"]
    patch = patching.Patch(Trainer, "step", _owned_step,
                           owns=lambda self, *a, **k: getattr(self, "mine", False))
    fix = patching.register(patching.Fix("guarded_step", "test", "core", (patch,)))
    with patching.holding("core"):
        assert patching.is_installed(fix)
        plain, owned = Trainer(), Owned()
        assert Trainer.step(plain, 2, force=True) == ("original", plain, 2, True)
        assert Trainer.step(owned, 2)[0] == "owned"
    assert vars(Trainer)["step"] is original


def test_a_second_fix_on_an_attribute_is_refused_at_registration(registry):
    first = patching.Fix("first", "test", "core", (patching.Patch(Trainer, "step", _owned_step),))
    patching.register(first)
    second = patching.Fix("second", "test", "stages",
                          (patching.Patch(Trainer, "step", _owned_step),))
    with pytest.raises(ValueError, match=r"'first' and 'second' both patch .*Trainer\.step"):
        patching.register(second)
    assert patching.known() == [first]
    assert patching.register(first) is first  # the same fix again is no second fix


def test_one_fix_patching_an_attribute_twice_is_refused(registry):
    twice = (patching.Patch(Trainer, "step", _owned_step),) * 2
    with pytest.raises(ValueError, match="'twice' and 'twice' both patch"):
        patching.register(patching.Fix("twice", "test", "core", twice))


def test_a_fix_that_is_part_of_another_patches_nothing():
    with pytest.raises(ValueError, match="part of 'owner'"):
        patching.Fix("part", "test", "core", (patching.Patch(Trainer, "step", _owned_step),),
                     part_of="owner")


def test_compose_runs_the_wraps_in_the_order_given():
    order = []

    def tagged(tag):
        def wrap(original):
            def function(*args):
                order.append(tag)
                return original(*args)

            return function

        return wrap

    composed = patching.compose(tagged("first"), tagged("second"))(lambda value: value)
    assert composed(3) == 3 and order == ["first", "second"]
