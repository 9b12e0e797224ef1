"""Session set-up shared by every test layer.

TensorFlow fixes its device list the first time it touches devices, and a
pytest run is one process, so the 4 logical CPU devices the strategy tests
need are made here, before any test runs.
"""

import os
import pathlib
import signal
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's CPU allocator keeps the statistics tf.config.experimental.get_memory_info
# reads (the peak bytes the 1F1B memory test compares) only when it is a BFC allocator;
# the default one raises "Cannot reset memory stats for device 'CPU:0'".
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import pytest
from launch_helpers import all_pids, is_alive  # beside this file

import hybridpar

LOGICAL_CPUS = 4
# The zoo's conformance table: each zoo test calls ``record_property("zoo", {"model": ...,
# "mode": ..., <figure>: value})``; pytest-xdist sends those properties to the controller
# with the test's report. These hooks live here, not in tests/zoo/conftest.py, because the
# xdist controller collects nothing and so loads only this conftest.


def pytest_configure(config: pytest.Config) -> None:
    hybridpar.testing.use_logical_cpus(LOGICAL_CPUS)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers), every Ray test goes to one worker,
    so the session starts one Ray cluster, and the longest tests are handed out first (the
    zoo's CNNs and the Keras suite, minutes each, left last made the run wait on one worker).
    Every ``test_upstream_*`` is marked ``upstream`` (``make test-versions`` selects them).
    """
    for item in items:
        if item.name.startswith("test_upstream_"):
            item.add_marker(pytest.mark.upstream)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=_start_order)  # stable: the same order on every worker


LONGEST_FIRST = ("zoo", "keras_suite", "multiworker", "ray")


def _start_order(item: pytest.Item) -> int:
    return next((rank for rank, marker in enumerate(LONGEST_FIRST)
                 if item.get_closest_marker(marker)), len(LONGEST_FIRST))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Fails the run when xdist dropped the Ray group (it did with pytest 9.2)."""
    on_worker = hasattr(session.config, "workerinput")  # the controller collects nothing
    if not on_worker or session.config.getoption("dist", "no") != "loadgroup":
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("ray") and not item.nodeid.endswith("@ray")]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not put {lost[0]} in the 'ray' group (pytest "
            f"{pytest.__version__}): each worker would start its own Ray cluster. Install the "
            "pinned versions: pip install -c requirements/constraints.txt -e '.[test,ray]'."
        )


@pytest.fixture(scope="session")
def digits_data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tfds data dir holding the embedded hybridpar_digits set, built once."""
    data_dir = tmp_path_factory.mktemp("tfds")
    hybridpar.data.load_tfds("hybridpar_digits", "train", data_dir)
    return str(data_dir)


@pytest.fixture
def records(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    directory = tmp_path / "records"
    directory.mkdir()
    yield directory
    for pid in all_pids(directory):  # never leave a sleeper behind, whatever happened
        if is_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def tensorboard_scalars():
    """Reads TensorBoard event files back: ``read(log_dir)`` -> {step: {scalar tags}}."""
    import tensorflow as tf

    def read(log_dir) -> dict[int, set[str]]:
        found: dict[int, set[str]] = {}
        for path in sorted(log_dir.glob("events.out.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for value in event.summary.value:
                    found.setdefault(event.step, set()).add(value.tag)
        return found

    return read


_ROWS: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" or not report.passed:
        return
    for name, value in report.user_properties:
        if name == "zoo":
            _ROWS.append(value)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _ROWS:
        return
    figures = sorted({key for row in _ROWS for key in row} - {"model", "mode"})
    terminalreporter.section("model zoo conformance (max abs differences)")
    header = ["model", "mode", *figures]
    terminalreporter.write_line(" | ".join(header))
    for row in sorted(_ROWS, key=lambda r: (r["model"], r["mode"])):
        cells = [row["model"], row["mode"]]
        cells += [f"{row[f]:.2g}" if isinstance(row.get(f), float) else str(row.get(f, "-"))
                  for f in figures]
        terminalreporter.write_line(" | ".join(cells))
