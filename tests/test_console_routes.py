"""The console's server side: its page and assets (open, revalidated, locked down by
their Content-Security-Policy), its two reads (behind access control), and off."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from app.auth.apikeys import mint
from app.console.routes import ASSETS, load_assets
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage.topic_catalog import TopicConfig
from tests.helpers.asgi import served
from tests.helpers.auth import bearer
from tests.helpers.stack import make_settings, serving_compactor


def _auth_file(tmp_path: Path, topic: str) -> tuple[Path, str]:
    token, stored = mint()
    path = tmp_path / "auth.toml"
    path.write_text(f'[principals.reader]\nkeys = ["{stored}"]\nconsume = ["{topic}"]\n')
    return path, token


def test_every_file_the_page_names_is_served_and_nothing_else_is() -> None:
    assets = load_assets()
    page = assets["index.html"].body.decode()
    named = re.findall(r'(?:href|src)="/console/assets/([^"]+)"', page)
    assert named and all(name in assets for name in named)
    # Every module the page imports, however deep, is served (a typo would be a blank
    # page in the browser only).
    for name, asset in assets.items():
        if not name.endswith(".js"):
            continue
        for target in re.findall(r'from "(\.{1,2}/[^"]+)"', asset.body.decode()):
            resolved = (ASSETS / name).parent.joinpath(target).resolve()
            assert resolved.relative_to(ASSETS.resolve()).as_posix() in assets, (name, target)
    assert not any(n.endswith((".d.ts", ".json", "LICENSE")) for n in assets)


async def test_the_page_and_assets_are_open_revalidated_and_locked_down(
        stack: LocalStack, tmp_path: Path, topic: str) -> None:
    auth_file, _ = _auth_file(tmp_path, topic)
    app = create_app(make_settings(stack, auth="on", auth_file=auth_file))
    async with served(app) as http:
        page = await http.get("/console")
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        slash = await http.get("/console/")
        assert slash.status_code == 308 and slash.headers["location"] == "/console"
        module = await http.get("/console/assets/js/main.js")
        assert module.status_code == 200
        assert module.headers["content-type"].startswith("text/javascript")
        again = await http.get("/console/assets/js/main.js",
                               headers={"if-none-match": module.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        missing = await http.get("/console/assets/js/nothing.js")
        assert missing.status_code == 404 and missing.json()["error_type"] == "NotFound"
        escape = await http.get("/console/assets/../api/series")
        assert escape.status_code in (401, 404)
        # What holds data is not open: the metrics ring and the placement need a token.
        assert (await http.get("/console/api/series")).status_code == 401
        assert (await http.get(f"/console/api/placement/{topic}")).status_code == 401


async def test_the_reads_answer_a_principal_within_its_rights(
        stack: LocalStack, tmp_path: Path, topic: str) -> None:
    auth_file, token = _auth_file(tmp_path, topic)
    app = create_app(make_settings(stack, auth="on", auth_file=auth_file))
    async with served(app) as http:
        series = await http.get("/console/api/series", headers=bearer(token))
        assert series.status_code == 200, series.text
        body = series.json()
        assert body["broker"]["broker_id"] and "t_ms" in body["series"]
        unknown = await http.get(f"/console/api/placement/{topic}", headers=bearer(token))
        assert unknown.status_code == 404 and unknown.json()["error_type"] == "UnknownTopic"
        await app.state.broker.admin.catalog.create(topic, 3, TopicConfig())
        await app.state.broker.forget_topic(topic)  # as POST /topics does
        placed = await http.get(f"/console/api/placement/{topic}",
                                params={"from_partition": 1, "max_partitions": 5},
                                headers=bearer(token))
        assert placed.status_code == 200, placed.text
        # Only the topic's own partitions, however many were asked for.
        assert placed.json() == {"topic": topic, "affinity": False, "partitions": [
            {"partition": 1}, {"partition": 2}]}
        refused = await http.get("/console/api/placement/elsewhere", headers=bearer(token))
        assert refused.status_code == 403 and refused.json()["error_type"] == "Forbidden"


async def test_off_serves_nothing_and_samples_nothing(stack: LocalStack) -> None:
    app = create_app(make_settings(stack, console="off"))
    async with served(app) as http:
        for path in ("/console", "/console/assets/js/main.js", "/console/api/series"):
            answer = await http.get(path)
            assert answer.status_code == 404 and answer.json()["error_type"] == "NotFound"
    assert not any(getattr(r, "path", "").startswith("/console") for r in app.router.routes)


async def test_the_console_is_not_in_the_api_document(stack: LocalStack) -> None:
    app = create_app(make_settings(stack))
    async with served(app) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
        assert not [p for p in paths if p.startswith("/console")]
        assert "/whoami" in paths


def test_the_vendored_files_are_the_pinned_ones() -> None:
    vendor = ASSETS / "vendor"
    rows = re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$",
                      (vendor / "README.md").read_text(), re.MULTILINE)
    files = {p.name for p in vendor.iterdir()} - {"README.md", "uplot.LICENSE"}
    assert {name for name, _ in rows} == files
    for name, digest in rows:
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name


async def test_the_standalone_compactor_is_read_from_the_brokers_side(
        stack: LocalStack, tmp_path: Path) -> None:
    async with serving_compactor(stack, tmp_path, "console-compactor") as url:
        app = create_app(make_settings(stack, compactor_url=url))
        async with served(app) as http:
            seen = (await http.get("/console/api/compactor")).json()
            assert seen["configured"] is True
            found = seen["compactor"]
            assert found["reachable"] is True and found["error"] is None, found
            assert found["status"] == "ok" and found["compactor_id"] == "console-compactor"
            # Its /metrics read too: the backlog it sees, the runs it made (on whatever
            # the session's store holds).
            assert found["lag_records"] is not None and found["runs"] >= 0
    # Gone: said so, without failing the page.
    async with served(create_app(make_settings(stack, compactor_url=url))) as http:
        for _ in range(2):  # the second within FRESH_S: the same reading
            gone = (await http.get("/console/api/compactor")).json()["compactor"]
            assert gone["reachable"] is False and gone["error"]
    async with served(create_app(make_settings(stack))) as http:
        assert (await http.get("/console/api/compactor")).json() == {
            "configured": False, "compactor": None}
