"""ZeRO stage 1's plan: flat buckets balanced to one element, and the optimizers it refuses."""

import itertools

import pytest

from hybridpar import ConfigError, StrategyConfig
from hybridpar.parallel import zero_plan
from hybridpar.parallel.zero_plan import VariableSpec


def specs(*shapes, dtype="float32", group=()):
    return [VariableSpec(f"v{i}", shape, dtype, group) for i, shape in enumerate(shapes)]


@pytest.mark.parametrize("elements, replicas", [(697, 4), (10, 4), (3, 4), (8, 4), (1, 2),
                                                (1_000_003, 7)])
def test_shards_are_balanced_to_one_element_and_cover_the_bucket(elements, replicas):
    (bucket,) = zero_plan.plan(specs((elements,)), replicas).buckets
    lengths = bucket.shard_lengths()
    assert sum(lengths) == elements and max(lengths) - min(lengths) <= 1
    assert bucket.shard_size == max(1, max(lengths))
    starts = bucket.shard_starts()
    assert starts[0] == 0
    assert all(s + n == t for s, n, t in zip(starts, lengths, starts[1:], strict=False))


def test_every_tensor_is_flattened_into_its_dtype_and_device_group_bucket():
    plan = zero_plan.plan(
        specs((16, 33), (33,)) + specs((4,), dtype="float16")
        + specs((33, 4), group=("/cpu:1",)), replicas=4)
    assert [(b.dtype, b.group, b.indices, b.sizes) for b in plan.buckets] == [
        ("float32", (), (0, 1), (528, 33)), ("float16", (), (2,), (4,)),
        ("float32", ("/cpu:1",), (3,), (132,))]
    assert zero_plan.THRESHOLD_ELEMENTS == 0  # a 4-element bias is sharded too


@pytest.mark.parametrize("shapes, replicas", [(((16, 33), (33,), (33, 4), (4,)), 4),
                                              (((5,), (0,), (), (3, 2)), 3), (((2,),), 4)])
def test_the_pieces_of_the_shards_cover_every_variable_once(shapes, replicas):
    """What a checkpoint stores of each shard: every element of every variable, once."""
    (bucket,) = zero_plan.plan(specs(*shapes), replicas).buckets
    held = {i: [] for i in bucket.indices}
    for replica in range(replicas):
        shard = bucket.shard_starts()[replica]
        for piece in bucket.pieces(replica):
            start = bucket.offsets()[bucket.indices.index(piece.index)] + piece.start
            assert start == shard + piece.shard_offset or piece.size == 0  # where it is held
            assert piece.shard_offset + piece.length <= bucket.shard_lengths()[replica]
            held[piece.index].append((piece.start, piece.length))
    for index, size in zip(bucket.indices, bucket.sizes, strict=True):
        covered = sorted(held[index])
        assert covered[0][0] == 0 and sum(n for _, n in covered) == size
        assert all(s + n == t for (s, n), (t, _) in itertools.pairwise(covered))


def test_the_summary_names_variables_buckets_and_per_replica_elements():
    plan = zero_plan.plan(specs((16, 33), (33,), (33, 4), (4,)), 4)
    assert plan.summary() == ("optimizer state sharded over 4 replicas: 4 variable(s), 697 "
                              "elements in 1 bucket(s); 174 to 175 elements per replica")


@pytest.mark.parametrize("name", zero_plan.ELEMENT_WISE)
def test_element_wise_optimizers_are_accepted(name):
    zero_plan.check_shardable(name, {}, "mirrored")


def test_an_optimizer_whose_update_reads_a_whole_tensor_is_refused():
    with pytest.raises(ConfigError, match=r"shard_optimizer_state=true \(mode 'multi_worker'\)"
                       r".*Lamb cannot be sharded: its trust ratio.*Use one of SGD, Adam"):
        zero_plan.check_shardable("Lamb", {}, "multi_worker")
    with pytest.raises(ConfigError, match="hybridpar does not know its update"):
        zero_plan.check_shardable("MyOptimizer", {}, "mirrored")


def test_the_config_key_is_declared_and_refused_in_parameter_server_mode():
    assert StrategyConfig().data_parallel.shard_optimizer_state is False
    config = StrategyConfig().override({"data_parallel.shard_optimizer_state": True})
    assert config.data_parallel.shard_optimizer_state is True
    with pytest.raises(ConfigError, match="must be true/false"):
        StrategyConfig.from_dict({"data_parallel": {"shard_optimizer_state": 2}})
    with pytest.raises(ConfigError, match="needs mode .mirrored. or .multi_worker."):
        StrategyConfig.from_dict({"data_parallel": {"mode": "parameter_server",
                                                    "shard_optimizer_state": True}})


def test_buckets_are_capped_and_a_larger_variable_is_a_bucket_of_its_own():
    plan = zero_plan.plan(specs((6,), (3,), (2,), (20,), (1,), (4,)), 2, bucket_elements=10)
    assert [b.indices for b in plan.buckets] == [(0, 1), (2,), (3,), (4, 5)]
    assert zero_plan.BUCKET_ELEMENTS == 2**20
    # the benchmark's MLP 256-1024-1024-10: the 1024 x 1024 kernel fills one bucket
    mlp = specs((256, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,))
    assert [b.indices for b in zero_plan.plan(mlp, 4).buckets] == [(0, 1), (2,), (3, 4, 5)]
