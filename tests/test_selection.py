"""The marks a test gets from its fixtures, and the skips a run refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.settings import Settings
from tests.helpers import selection
from tests.helpers.selection import Skip, slow_fixture, starts_servers


@pytest.fixture
@slow_fixture
def heavy() -> str:
    return "heavy"


@pytest.fixture
@starts_servers(slow=True)
def own_cluster() -> Iterator[str]:
    yield "cluster"  # stands in for a fixture that runs servers of its own


@pytest.fixture
def on_top_of_the_cluster(own_cluster: str) -> str:
    return own_cluster


@pytest.fixture(scope="module")
def module_broker() -> str:
    return "broker"


def marks(request: pytest.FixtureRequest) -> set[str]:
    return {m.name for m in request.node.iter_markers()}


def group(request: pytest.FixtureRequest) -> str | None:
    found = request.node.get_closest_marker("xdist_group")
    return str(found.args[0]) if found is not None else None


def test_a_test_of_pure_logic_has_no_server_marks(request: pytest.FixtureRequest) -> None:
    assert not marks(request) & {"stack", "slow", "own_servers"}
    assert group(request) is None  # spread over the processes one by one


def test_a_test_reaching_the_stack_through_other_fixtures_is_a_stack_test(
        settings: Settings, request: pytest.FixtureRequest) -> None:
    assert "stack" in marks(request)
    assert not marks(request) & {"slow", "own_servers"}


def test_a_slow_fixture_makes_its_tests_slow(heavy: str,
                                             request: pytest.FixtureRequest) -> None:
    assert "slow" in marks(request) and "stack" not in marks(request)


def test_own_servers_deep_in_the_fixtures_run_one_at_a_time(
        on_top_of_the_cluster: str, request: pytest.FixtureRequest) -> None:
    assert {"stack", "slow", "own_servers"} <= marks(request)
    assert group(request) == "own-servers"


def test_a_module_fixture_keeps_its_modules_tests_together(
        module_broker: str, request: pytest.FixtureRequest) -> None:
    assert group(request) == "tests/test_selection.py"


def test_only_allowed_skips_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    skips = [Skip("a::t", "Java is missing"), Skip("b::t", "needs a GPU on this machine")]
    monkeypatch.setattr(selection, "ALLOWED_SKIPS", ())
    assert selection.unexpected(skips) == skips
    monkeypatch.setattr(selection, "ALLOWED_SKIPS", ((r"needs a GPU", "no GPU in CI"),))
    assert selection.unexpected(skips) == [skips[0]]
