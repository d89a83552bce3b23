"""docs/architecture.md names the code it describes; every module, package, class,
function and method it names in backticks exists, so the page cannot drift from the code
unseen."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/architecture.md"
SOURCES = ("app", "jobs", "clients/python/src")
# Backticked words of the page that are not code: storage keys, settings, HTTP, the
# command and its entry-point group, record fields on the wire.
NOT_CODE = re.compile(
    r"^(LLOG_[A-Z_*]+(=\w+)?|meta/\w+|POST .*|GET .*|llog( .*)?|llog-client|llog\.commands"
    r"|fetch_offset: .*|error_type|http_status|retriable|maybe_written)$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class CodeIndex:
    """What the sources define: modules by file stem (their top-level names), classes by
    name (their members), and every function or class name anywhere."""

    modules: dict[str, set[str]] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)
    classes: dict[str, set[str]] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    def add(self, path: Path) -> None:
        tree = ast.parse(path.read_text())
        top = self.modules.setdefault(path.stem, set())
        for node in tree.body:
            top.update(_bound(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.names.add(node.name)
            if isinstance(node, ast.ClassDef):
                members = self.classes.setdefault(node.name, set())
                for item in node.body:
                    members.update(_bound(item))

    def knows(self, name: str) -> bool:
        """``a.b.c``: a module path (``app.cli``), a module's top-level name
        (``produce.produce``, ``routes.produce.produce``), a class member
        (``LogWriter.append_shared``); a bare name: a module, package, class or
        function."""
        parts = name.split(".")
        if len(parts) == 1:
            return name in self.modules or name in self.packages or name in self.names
        if parts[-2] in self.classes and parts[-1] in self.classes[parts[-2]]:
            return True
        if parts[-2] in self.modules and parts[-1] in self.modules[parts[-2]]:
            return True
        return all(p in self.modules or p in self.packages for p in parts)


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _index() -> CodeIndex:
    index = CodeIndex()
    for source in SOURCES:
        for path in (ROOT / source).rglob("*.py"):
            index.add(path)
            if path.name == "__init__.py":
                index.packages.add(path.parent.name)
    return index


def _missing_path(token: str) -> bool:
    """``app/x/``, ``app/x.py``, ``tests/y.py``: from the root; ``slots.py``: anywhere
    in the sources."""
    if "/" in token.rstrip("/"):
        return not (ROOT / token).exists()
    return not any(next((ROOT / s).rglob(token), None) for s in SOURCES)


def test_every_name_the_page_gives_is_in_the_code() -> None:
    index = _index()
    tokens = set(re.findall(r"`([^`\n]+)`", PAGE.read_text()))
    missing, unread = [], []
    for token in sorted(tokens):
        name = re.sub(r"\(.*\)$", "", token)  # create_app(settings) -> create_app
        if NOT_CODE.match(token):
            continue
        if token.endswith((".py", "/")):
            if _missing_path(token):
                missing.append(token)
        elif IDENTIFIER.match(name):
            if not index.knows(name):
                missing.append(token)
        else:
            unread.append(token)
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
    assert not unread, f"neither code nor listed as not code (NOT_CODE): {unread}"
    assert len(tokens) > 50  # the page was read


ARROW = re.compile(r"^(\w+)\s+──►\s+(.+)$")


def _drawn() -> dict[str, set[str]]:
    """The page's "Who imports whom" lines: a package, then the ones it imports."""
    section = PAGE.read_text().split("## Who imports whom", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    drawn: dict[str, set[str]] = {}
    for line in block.strip().splitlines():
        found = ARROW.match(line.strip())
        assert found, f"not a line of the graph: {line!r}"
        assert found[1] not in drawn, f"{found[1]} is drawn twice"
        drawn[found[1]] = {name.strip() for name in found[2].split(",")}
    return drawn


def test_the_page_draws_every_import_between_packages_and_no_other() -> None:
    """Arrow for arrow: an import the page does not draw, or an arrow no import makes,
    fails (the first is how the page went stale before)."""
    from tests.test_architecture import _package_imports

    code = {package: set(imported) for package, imported in _package_imports().items()
            if imported}
    drawn = _drawn()
    missing = sorted(f"{a} ──► {b}" for a, targets in code.items()
                     for b in targets - drawn.get(a, set()))
    extra = sorted(f"{a} ──► {b}" for a, targets in drawn.items()
                   for b in targets - code.get(a, set()))
    assert not missing, f"imports docs/architecture.md does not draw: {missing}"
    assert not extra, f"arrows in docs/architecture.md no import makes: {extra}"
