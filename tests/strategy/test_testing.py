"""hybridpar.testing.use_logical_cpus once TensorFlow has its devices."""

import pytest
import tensorflow as tf

import hybridpar
from hybridpar import ConfigError, RuntimeMismatchError


def test_same_count_again_is_harmless():
    assert len(tf.config.list_logical_devices("CPU")) == 4
    assert hybridpar.testing.use_logical_cpus(4) == [f"/device:CPU:{i}" for i in range(4)]


def test_a_different_count_after_initialisation_is_a_clear_error():
    with pytest.raises(RuntimeMismatchError, match=r"use_logical_cpus\(2\) came too late: "
                       r"TensorFlow has already initialised its devices \(4 logical CPU\(s\)"):
        hybridpar.testing.use_logical_cpus(2)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_count_must_be_a_positive_integer(n):
    with pytest.raises(ConfigError, match="positive integer"):
        hybridpar.testing.use_logical_cpus(n)
