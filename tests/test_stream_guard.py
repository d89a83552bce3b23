"""A stream's re-check, as pure logic: the guard of a stream wakes on a reload of the
auth file (never by polling) and at its JWT's expiry."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from prometheus_client import CollectorRegistry

from app.auth.apikeys import mint
from app.auth.authfile import parse
from app.auth.control import AccessControl
from app.errors import Forbidden, Unauthenticated, Unavailable
from app.routes.stream_guard import StreamGuard
from app.settings import Settings


def _control(tmp_path: Path, text: str) -> AccessControl:
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(text)
    control = AccessControl(Settings(auth="on", auth_file=auth_file), CollectorRegistry())
    control._apply(parse(text))
    return control


async def test_the_guard_wakes_on_a_reload_that_takes_access_away(tmp_path: Path) -> None:
    token, stored = mint()
    kept = 'consume = ["orders"]\n'
    control = _control(tmp_path, f'[principals.r]\nkeys = ["{stored}"]\n{kept}')
    principal = await control.authenticate(f"Bearer {token}")
    guard = StreamGuard(control, principal, "orders")
    assert guard.refusal() is None
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            found: list[object] = []

            async def watch() -> None:
                found.append(await guard.revoked())

            tg.start_soon(watch)
            await anyio.wait_all_tasks_blocked()
            control._apply(parse(f'[principals.r]\nkeys = ["{stored}"]\n{kept}'))
            await anyio.wait_all_tasks_blocked()
            assert not found  # a reload that changed nothing for it
            control._apply(parse(f'[principals.r]\nkeys = ["{stored}"]\n'))
    assert isinstance(found[0], Forbidden)


async def test_the_guard_ends_a_stream_at_its_credential_s_expiry(tmp_path: Path) -> None:
    control = _control(tmp_path, '[default]\nconsume = ["orders"]\n')
    principal = control.principal("svc", "jwt", expires_at=0.0)  # long past
    guard = StreamGuard(control, principal, "orders")
    with anyio.fail_after(10):
        refused = await guard.revoked()
    assert isinstance(refused, Unauthenticated) and "expired" in str(refused)


async def test_no_batch_is_sent_past_the_expiry_even_by_a_read_that_never_waits(
        tmp_path: Path) -> None:
    # A read that returns without a checkpoint ends the race before the watch has run
    # once: the expiry must hold by the clock, not by the watch being scheduled.
    control = _control(tmp_path, '[default]\nconsume = ["orders"]\n')
    principal = control.principal("svc", "jwt", expires_at=time.time() + 0.3)
    guard = StreamGuard(control, principal, "orders")

    async def read_at_once() -> int:
        return 1

    expires_at = principal.expires_at
    assert expires_at is not None
    with anyio.fail_after(10):
        while True:
            started = time.time()
            outcome = await guard.unless_revoked(read_at_once)
            if isinstance(outcome, tuple):
                assert started < expires_at, "a batch read past the expiry was sent"
                continue
            assert isinstance(outcome, Unauthenticated) and "expired" in str(outcome)
            break


async def test_each_send_rechecks_access_and_a_refusal_wins_over_a_failed_read(
        tmp_path: Path) -> None:
    """The stream asks refusal_now() before each event that carries records (a send may
    wait on a slow client long after its batch was read), and a read that raises after
    the credential's end answers the refusal, not its own error."""
    token, stored = mint()
    control = _control(tmp_path, f'[principals.r]\nkeys = ["{stored}"]\nconsume = ["orders"]\n')
    principal = await control.authenticate(f"Bearer {token}")
    guard = StreamGuard(control, principal, "orders")
    assert guard.refusal_now() is None
    control._apply(parse(f'[principals.r]\nkeys = ["{stored}"]\n'))  # consume taken away
    assert isinstance(guard.refusal_now(), Forbidden)

    expiring = StreamGuard(control, control.principal("svc", "jwt", expires_at=0.0), "orders")

    async def failing_read() -> int:
        raise Unavailable("the answer budget is full")

    with anyio.fail_after(10):
        outcome = await expiring.unless_revoked(failing_read)
    assert isinstance(outcome, Unauthenticated) and "expired" in str(outcome)
