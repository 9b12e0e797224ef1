"""The fixes page's table, rendered from fix records (``hybridpar.compat.fix_table``).

``fix_table.py`` and ``patching.py`` import only the standard library; both are
loaded from their files so these tests import neither Keras nor TensorFlow.
"""

import importlib.util
import pathlib
import sys

COMPAT = pathlib.Path(__file__).resolve().parents[2] / "hybridpar" / "compat"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", COMPAT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


patching = load("patching")
fix_table = load("fix_table")


class Trainer:
    def fit(self):
        return "fit"


def test_each_fix_is_one_row_naming_what_it_replaces():
    fixes = [
        patching.Fix(name="routing", corrects="fit ignores the strategy | silently",
                     group="core", upstream="keras-team/keras#1",
                     patches=(patching.Patch(Trainer, "fit", lambda original: original),)),
        patching.Fix(name="inner", corrects="x", group="core", part_of="routing"),
        patching.Fix(name="override", corrects="y", group="parameter_server"),
    ]
    lines = fix_table.markdown_table(fixes).splitlines()
    assert len(lines) == 2 + len(fixes)
    assert lines[2] == ("| `routing` | fit ignores the strategy \\| silently | keras-team/keras#1 "
                        "| `core` | `Trainer.fit` |")
    assert lines[3].endswith("| - | `core` | in `routing`'s patch |")
    assert lines[4].endswith("| `parameter_server` | hybridpar's own strategy classes and "
                             "collectives |")
