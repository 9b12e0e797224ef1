"""The configuration reference is read from the sections, so it lists every key (pure)."""

import dataclasses
from typing import ClassVar

import pytest

from hybridpar import StrategyConfig
from hybridpar.config.engine import Section, dotted_keys
from hybridpar.config.reference import field_descriptions, markdown_reference, reference_rows


def test_every_key_strategyconfig_accepts_is_in_the_reference():
    keys = [row.key for row in reference_rows()]
    assert set(dotted_keys(StrategyConfig, "")) <= set(keys)
    assert len(keys) == len(set(keys))


def test_every_key_has_a_description_and_its_real_default():
    config = StrategyConfig()
    rows = {row.key: row for row in reference_rows()}
    assert all(row.description for row in rows.values())
    assert rows["checkpoint.keep"].default == str(config.checkpoint.keep) == "3"
    assert rows["data_parallel.mode"].default == "auto"
    assert rows["data_parallel.mode"].type.startswith("'auto' | 'none'")
    assert rows["checkpoint.backup_and_restore"].default == "true"
    assert rows["communication.powersgd"].default == "null"  # an optional section
    assert rows["communication.powersgd.rank"].default == "4"


def test_a_description_may_run_over_several_lines():
    text = field_descriptions(type(StrategyConfig().communication))["compression"]
    assert text.startswith("gradient compression on the wire") and "error feedback." in text


def test_a_key_without_a_description_is_refused_by_name():
    @dataclasses.dataclass(frozen=True)
    class Undocumented(Section):
        """A section.

        Attributes:
            documented: has a line.
        """

        PATH: ClassVar[str] = "undocumented"
        documented: int = 1
        forgotten: int = 2

    with pytest.raises(ValueError, match="'undocumented.forgotten' has no entry"):
        reference_rows(Undocumented, "undocumented.")


def test_the_markdown_has_one_table_per_section():
    text = markdown_reference()
    sections = [f.name for f in dataclasses.fields(StrategyConfig)]
    assert [line[4:-1] for line in text.splitlines() if line.startswith("## ")] == sections
    assert "| `model_parallel.placement` |" in text
