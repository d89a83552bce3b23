"""Rules of the code's shape, checked on every run: packages import each other without
cycles (docs/architecture.md draws the graph), functions stay short, and the HTTP edge
(app/routes/) holds adapters, models and OpenAPI pieces, the work being the broker's."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients/python/src/llog_client"
MAX_FUNCTION_LINES = 60
# A longer function says why in its docstring with this phrase.
LONG_BECAUSE = "long because"
# What of the storage engine a route module may name: the vocabulary its models and
# parsers share with the engine (keys, names, records, batches, topic settings, append
# outcomes), never what reads, writes or caches.
ROUTE_STORAGE_MODULES = {"keys", "names", "log_record", "batch", "compression",
                         "topic_catalog", "appends"}
MODEL_MODULES = {"models.py", "group_models.py"}
# What the rest of the code may import of each store's client package: the store itself,
# and for Oxia the change notifications (the broker's watch) and the patches of the
# ``oxia`` package (the local stack's own clients). The rest of a package (its wire
# formats, channels, signers, shard discovery) is that store's business alone.
STORE_SURFACES = {"app.stores.oxia": {"store", "notifications", "patches"},
                  "app.stores.s3": {"store"}}


def _package_imports() -> dict[str, set[str]]:
    """app's packages (and top-level modules) -> the ones they import."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in (ROOT / "app").rglob("*.py"):
        source = path.relative_to(ROOT / "app").parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "app" and len(parts) > 1 and parts[1] != source:
                    graph[source].add(parts[1])
    return graph


def _imported(path: Path) -> list[str]:
    """Every name ``path`` imports, at the top or inside a function: each module, and
    each ``module.name`` of a from-import (which may itself be a module)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def _job_module_imports() -> dict[str, set[str]]:
    """jobs/spark's modules -> the ones they import (at the top or inside a function:
    a cycle through a deferred import is still one)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in (ROOT / "jobs/spark").glob("*.py"):
        for name in _imported(path):
            parts = name.split(".")
            if parts[:2] == ["jobs", "spark"] and len(parts) > 2 \
                    and (ROOT / "jobs/spark" / f"{parts[2]}.py").exists() \
                    and parts[2] != path.stem:
                graph[path.stem].add(parts[2])
    return graph


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != "open", f"import cycle: {' -> '.join([*path, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_packages_import_each_other_without_cycles() -> None:
    _assert_acyclic(_package_imports())


def test_the_spark_jobs_import_each_other_without_cycles() -> None:
    """A job is run by name (``llog spark NAME``, ``python -m jobs.spark.NAME``) without
    the runner it uses knowing the jobs."""
    graph = _job_module_imports()
    assert graph["cli"] >= {"audit", "vacuum", "backfill", "export"}  # the graph is read
    _assert_acyclic(graph)


def test_the_engine_knows_nothing_above_it() -> None:
    graph = _package_imports()
    assert graph["storage"] <= {"errors", "settings", "clock", "stores"}
    assert graph["stores"] <= {"errors", "settings"}  # the store clients know no log
    assert graph["errors"] == set()
    assert graph["clock"] == set()  # the wall clock every layer reads imports nothing
    assert "broker" not in graph["compaction"] and "routes" not in graph["compaction"]
    # Membership and preferences sit on the engine; brokers use them, never the reverse.
    assert "cluster" in graph["broker"]
    assert not graph["cluster"] & {"broker", "routes", "groups", "compaction", "loadtest"}
    assert "cluster" in graph["loadtest"]  # the load generator ranks with the same hash


def test_the_stores_are_reached_through_their_surface() -> None:
    """Outside a store's package, only its surface (``STORE_SURFACES``) is imported, in
    the broker and the jobs alike (a benchmark that measures a store's parts, such as
    bench/s3_transports.py, may reach inside it)."""
    found: list[str] = []
    for folder in ("app", "jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            inside = path.relative_to(ROOT).with_suffix("").parts
            for name in _imported(path):
                for package, surface in STORE_SURFACES.items():
                    if package.split(".") == list(inside[:3]):
                        continue  # the package's own modules
                    if name.startswith(package + ".") and name.split(".")[3] not in surface:
                        found.append(f"{path.relative_to(ROOT)}: {name}")
    assert not found, "store modules imported past their surface:\n" + "\n".join(found)
    for package, surface in STORE_SURFACES.items():
        folder = ROOT / package.replace(".", "/")
        assert all((folder / f"{name}.py").exists() for name in surface), package


def test_the_client_needs_nothing_but_httpx() -> None:
    """llog-client is installed alone: its modules import the standard library, httpx
    (and anyio, httpx's own), zstandard (the optional zstd extra) and each other; nothing
    of the broker."""
    allowed = set(sys.stdlib_module_names) | {"httpx", "anyio", "zstandard", "llog_client"}
    found: dict[str, set[str]] = defaultdict(set)
    for path in CLIENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.split(".")[0] not in allowed:
                    found[path.name].add(name)
    assert not found, f"llog_client imports beyond httpx: {dict(found)}"
    assert list(CLIENT.glob("*.py")), "the client's sources moved?"


def test_functions_are_short_or_say_why() -> None:
    long: list[str] = []
    for folder in ("app", "jobs", "clients/python/src"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if lines > MAX_FUNCTION_LINES and LONG_BECAUSE not in doc.lower():
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                f"({lines} lines)")
    assert not long, "functions over 60 lines without a reason:\n" + "\n".join(long)


def _route_modules() -> list[tuple[str, ast.Module]]:
    found = [(path.name, ast.parse(path.read_text()))
             for path in sorted((ROOT / "app/routes").glob("*.py"))]
    assert len(found) > 10, "the route modules moved?"
    return found


def test_routes_reach_the_engine_through_the_broker() -> None:
    """A route adapts a request to a broker service and its outcome to a response: it
    imports no storage module that reads, writes or caches, nor the tail cache."""
    found: list[str] = []
    for name, tree in _route_modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            modules = ([node.module] if node.module != "app.storage"
                       else [f"app.storage.{a.name}" for a in node.names])
            for module in modules:
                parts = module.split(".")
                if parts[:2] == ["app", "tailcache"] or (
                        parts[:2] == ["app", "storage"]
                        and parts[2] not in ROUTE_STORAGE_MODULES):
                    found.append(f"{name}: {module}")
    assert not found, "route modules import the engine:\n" + "\n".join(found)


def test_routes_import_no_private_name_of_another_module() -> None:
    """What two ways in share lives in one module that says so (app/broker/answers.py,
    say), not in one route borrowed by another. (The model modules are one document
    in two files: group_models.py builds on models.py's private bases.)"""
    found = [f"{name}: {node.module}.{a.name}"
             for name, tree in _route_modules() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module
             and not (name in MODEL_MODULES and node.module == "app.routes.models")
             for a in node.names if a.name.startswith("_")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_no_route_refuses_a_role_itself() -> None:
    """A role the broker lacks is refused by its service (app/broker/roles.py), with
    one message per role, not by handlers checking for a missing service."""
    found = [f"{name}:{node.lineno}"
             for name, tree in _route_modules() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and (
                 getattr(node.func, "id", None) == "RoleDisabled"
                 or getattr(node.func, "attr", None) == "RoleDisabled")]
    assert not found, "routes that build RoleDisabled: " + ", ".join(found)


def test_no_route_handler_publishes_its_docstring() -> None:
    """FastAPI publishes a handler's docstring as its operation's description when the
    decorator sets none: a note for the code's readers would land in the API document.
    The document's descriptions are written in the decorators (or the OpenAPI pieces)."""
    found: list[str] = []
    for name, tree in _route_modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            routes = [d for d in node.decorator_list if isinstance(d, ast.Call)
                      and isinstance(d.func, ast.Attribute)
                      and getattr(d.func.value, "id", None) == "router"]
            described = any(k.arg == "description" for d in routes for k in d.keywords)
            if routes and not described and ast.get_docstring(node) is not None:
                found.append(f"{name}:{node.lineno} {node.name}")
    assert not found, "route handlers whose docstring FastAPI would publish:\n" + "\n".join(
        found)
