"""The OpenAPI documents as served, byte for byte: a change of the code's shape (moves,
renames, wiring) must not change the HTTP contract a generated client is built from.

The expected bytes are files under ``tests/openapi/``. A change that means to change the
contract writes them again, in the same commit, and the diff shows what changed::

    .venv/bin/python -m tests.test_openapi_unchanged --write
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from app.compactor_app import create_compactor_app
from app.factory import create_app
from app.settings import Settings

EXPECTED = Path(__file__).resolve().parent / "openapi"


def _broker() -> FastAPI:
    return create_app(Settings())


def _broker_with_auth() -> FastAPI:
    # The files are read only when the app starts: the document needs none of them.
    return create_app(Settings(
        auth="on", auth_file=Path("auth.toml"), auth_jwks_file=Path("jwks.json"),
        auth_jwt_issuer="https://issuer.test", auth_jwt_audience="llog"))


def _compactor() -> FastAPI:
    return create_compactor_app(Settings())


APPS: dict[str, Callable[[], FastAPI]] = {
    "broker.json": _broker, "broker-auth.json": _broker_with_auth,
    "compactor.json": _compactor}


async def _served(app: FastAPI) -> bytes:
    """``GET /openapi.json`` through the app's own stack, without starting it (no lifespan:
    the document needs no store)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://llog.test") as http:
        answer = await http.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    return answer.content


@pytest.mark.parametrize("name", sorted(APPS))
async def test_the_served_openapi_document_is_unchanged(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.startswith("LLOG_")]:
        monkeypatch.delenv(variable)  # the limits it shows are the defaults
    served = await _served(APPS[name]())
    expected = (EXPECTED / name).read_bytes()
    assert served == expected, (
        f"/openapi.json of {name} changed; if the contract means to change, write the "
        "files again: .venv/bin/python -m tests.test_openapi_unchanged --write")


def _write() -> None:
    for variable in [v for v in os.environ if v.startswith("LLOG_")]:
        del os.environ[variable]
    EXPECTED.mkdir(exist_ok=True)
    for name, make in APPS.items():
        (EXPECTED / name).write_bytes(asyncio.run(_served(make())))
        print(f"wrote {EXPECTED / name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_openapi_unchanged --write")
    _write()
