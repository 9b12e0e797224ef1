"""The conformance table: every zoo test records its row's figures, printed at the end.

A test calls ``record_property("zoo", {"model": ..., "mode": ..., <figure>: value})``;
pytest-xdist sends those properties to the controller with the test's report, where
they are collected and printed as one table in the terminal summary.
"""

from __future__ import annotations

import pytest

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
