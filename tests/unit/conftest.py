"""Fixtures of the unit tests."""

import os
import pathlib
import signal
from collections.abc import Iterator

import pytest
from launch_helpers import all_pids, is_alive


@pytest.fixture
def records(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    directory = tmp_path / "records"
    directory.mkdir()
    yield directory
    for pid in all_pids(directory):  # never leave a sleeper behind, whatever happened
        if is_alive(pid):
            os.kill(pid, signal.SIGKILL)
