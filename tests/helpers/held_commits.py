"""A writer's commit held on its way to Oxia, for tests of what a commit that lost a race
does when it reads again."""

from __future__ import annotations

import anyio

from app.stores.oxia.store import PutSpec
from tests.helpers.stack import Engine


def hold_first_commit(e: Engine, held: anyio.Event, release: anyio.Event) -> None:
    """``e``'s writer's first commit request waits for ``release`` on its way to Oxia
    (``held`` says it is there: the control version it expects was read)."""
    real = e.oxia.put_group

    async def put_group(puts: list[PutSpec]) -> list[int | Exception]:
        last = puts[-1]
        commit = (last.key.endswith("/meta/control") and last.expected_version is not None
                  and last.expected_version >= 0)
        if commit and not held.is_set():
            held.set()
            await release.wait()
        return await real(puts)

    e.oxia.put_group = put_group  # type: ignore[method-assign]
