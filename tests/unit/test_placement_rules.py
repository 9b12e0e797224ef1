"""Placement rules: which stage a layer belongs to (pure Python, no TensorFlow)."""

import pytest

from hybridpar.errors import ConfigError
from hybridpar.topology.placement import PlacementRules, current_stage, record_layer, stage

RULES = PlacementRules({"^block_[01]$": 0, "^block_[23]$": 1, "head": 1}, stages=2)


def path(*names: str) -> list[tuple[str, None]]:
    return [(name, None) for name in names]


def test_rules_are_searched_in_the_layer_name():
    assert RULES.rule_stage("block_2") == 1
    assert RULES.rule_stage("head_norm") == 1  # search, not full match
    assert RULES.rule_stage("embed") is None


def test_outermost_placed_layer_decides():
    assert RULES.resolve(path("block_2", "head_proj")) == 1
    assert RULES.resolve(path("block_0", "head")) == 0  # inside block_0, whatever its name
    assert RULES.resolve(path("encoder", "block_3", "dense")) == 1
    assert RULES.resolve(path("encoder", "dense")) is None  # caller puts it on stage 0


def test_stage_context_wins_over_rules_and_nests():
    assert RULES.resolve([("block_0", 1)]) == 1
    assert RULES.resolve([("wrapper", None), ("block_3", 0)]) == 0


def test_layer_matched_by_two_rules_names_both():
    rules = PlacementRules({"block": 0, "_3$": 1}, stages=2)
    with pytest.raises(ConfigError, match=r"Layer 'block_3' is matched by 2 .*'block', '_3\$'"):
        rules.resolve(path("block_3"))


def test_stage_index_past_the_stages_names_layer_and_source():
    with pytest.raises(ConfigError, match=r"Layer 'top' is placed on stage 3 by hybridpar.stage"
                                          r"\(\).*stages=2 allows stages 0..1"):
        RULES.resolve([("top", 3)])


def test_rule_matching_no_layer_is_an_error_listing_the_layers():
    rules = PlacementRules({"^block_9$": 1, "head": 1}, stages=2)
    with pytest.raises(ConfigError, match=r"rule\(s\) '\^block_9\$' match no layer.*"
                                          r"Layer names: embed, head"):
        rules.check_layers([path("embed"), path("head")])


def test_check_layers_returns_what_nothing_places():
    unplaced = RULES.check_layers(
        [path("embed"), path("block_0"), path("block_0", "dense"), path("block_2"), path("head")]
    )
    assert unplaced == [tuple(path("embed"))]


class Layer:
    name = "dense"


def test_stage_context_marks_layers_built_inside():
    assert current_stage() is None
    outside, inside = Layer(), Layer()
    with stage(1):
        with stage(0):
            assert current_stage() == 0
        record_layer(inside)
    record_layer(outside)
    assert inside._hybridpar_stage == 1
    assert not hasattr(outside, "_hybridpar_stage")


@pytest.mark.parametrize("index", [-1, 1.5, True, "1"])
def test_stage_index_must_be_a_natural_number(index):
    expected = r"stage\(\) takes a stage index >= 0. Received: index="
    with pytest.raises(ConfigError, match=expected), stage(index):
        pass
