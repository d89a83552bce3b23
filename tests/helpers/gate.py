"""The run's gate: a pytest plugin that fails a run in which something skipped for a
reason not on :data:`tests.helpers.selection.ALLOWED_SKIPS`.

Tests that skip while running and modules that skip while being collected (a
module-level ``pytest.importorskip`` or ``pytest.skip(..., allow_module_level=True)``)
both count; a module that fails to import is a collection error, which fails the run
without the gate. ``tests/conftest.py`` registers the plugin; another project loads it
with ``-p tests.helpers.gate``.

Under pytest-xdist the controller judges the run: the workers send it every test report
and every collection report that did not pass, and it calls the same hooks with them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import selection

_SKIPPED: list[selection.Skip] = []


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(selection.Skip(report.nodeid, selection.skip_reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module that skips at import has no test reports at all: its tests never exist.
    if report.skipped:
        _SKIPPED.append(selection.Skip(report.nodeid, selection.skip_reason(report)))


def _unexpected(config: pytest.Config) -> list[selection.Skip]:
    # A worker's own list is only part of the run; the controller has all of it.
    return [] if _is_worker(config) else selection.unexpected(_SKIPPED)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    unexpected = _unexpected(config)
    if unexpected:
        terminalreporter.section("skips not on the allow-list (tests/helpers/selection.py)",
                                 red=True)
        for skip in unexpected:
            terminalreporter.line(f"{skip.nodeid}: {skip.reason}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A run whose only module skipped at import collected nothing; it failed all the same.
    passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if exitstatus in passing and _unexpected(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
