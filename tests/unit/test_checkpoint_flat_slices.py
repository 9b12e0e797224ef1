"""A flat range of a tensor's elements as the boxes a tensor bundle stores (ZeRO's shards)."""

import math

import numpy as np
import pytest

from hybridpar.checkpoint import flat_slices


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), (4, 1, 3), (1, 5), (2, 2, 2, 3)])
def test_the_boxes_of_every_range_tile_it_in_order(shape):
    size = math.prod(shape)
    values = np.arange(size).reshape(shape)
    for start in range(size + 1):
        for length in range(size - start + 1):
            found = flat_slices.boxes(shape, start, length)
            if found is None:
                assert (start, length) == (0, size)
                continue
            assert len(found) <= 2 * len(shape) - 1
            read = [values[tuple(slice(o, o + n) for o, n in zip(*box, strict=True))].ravel()
                    for box in found]
            assert np.array_equal(np.concatenate(read or [np.zeros(0, int)]),
                                  np.arange(start, start + length))


def test_a_whole_tensor_a_scalar_and_an_empty_one_are_stored_whole():
    assert flat_slices.boxes((3, 4), 0, 12) is None
    assert flat_slices.boxes((), 0, 1) is None
    assert flat_slices.boxes((0, 4), 0, 0) is None
    assert flat_slices.spec((3, 4), None) == ""


def test_the_spec_is_tensorflows_shape_and_slice():
    (first, rows, last) = flat_slices.boxes((3, 4), 2, 8)
    assert [flat_slices.spec((3, 4), box) for box in (first, rows, last)] == [
        "3 4 0,1:2,2", "3 4 1,1:0,4", "3 4 2,1:0,2"]


def test_a_range_outside_the_tensor_is_refused():
    with pytest.raises(ValueError, match=r"elements 10:14 are outside a tensor of shape "
                                         r"\(3, 4\) \(12 elements\)"):
        flat_slices.boxes((3, 4), 10, 4)
