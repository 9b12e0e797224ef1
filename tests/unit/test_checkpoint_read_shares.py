"""Which worker reads which variable of a shared restore (pure)."""

import pytest

from hybridpar.checkpoint import read_shares


def test_each_worker_reads_about_its_part_of_the_bytes():
    sizes = [4_000, 100, 3_000, 2_000, 2_000, 50, 900, 12]
    owner = read_shares.owners(sizes, 2)
    loads = [sum(s for s, o in zip(sizes, owner, strict=True) if o == w) for w in range(2)]
    assert loads == [6_050, 6_012]  # within the largest tensor of an even split
    assert read_shares.owners(sizes, 2) == owner  # every worker computes the same
    assert read_shares.owners(sizes, 1) == [0] * len(sizes)
    assert sorted(set(read_shares.owners([1] * 10, 4))) == [0, 1, 2, 3]


def test_more_workers_than_tensors_leaves_some_reading_nothing():
    assert read_shares.owners([8, 8], 3) == [0, 1]
    with pytest.raises(ValueError, match="Received: workers=0"):
        read_shares.owners([8], 0)


def test_exchanges_hold_at_most_the_limit_or_one_larger_tensor():
    assert read_shares.chunks([10, 20, 30, 100, 5, 0], 50) == [[0, 1], [2], [3], [4, 5]]
    assert read_shares.chunks([], 50) == []
    assert read_shares.nbytes((3, 4), "float32") == 48
    assert read_shares.nbytes((), "int64") == 8
