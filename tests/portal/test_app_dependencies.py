"""The portal's apps depend on each other one way only (README, "Architecture in brief").

Each app may import the apps before it in ``ORDER``, never one after it:

    tenants -> cluster -> accounting -> jobs -> scheduling, notify -> agents -> api, web

plus ``ops``, which may import anything. Accounting sits before jobs because ending an
attempt (``portal.jobs.attempts``) charges its use. Notify follows jobs through the signal
``portal.jobs.transitions`` sends after a state change commits; scheduling and notify know
nothing of each other. Imports are read with ``ast`` from every
module of every app, at the top and inside functions alike; an import inside a function is
allowed only where Django or Celery needs it late (``tasks.py``, management commands, an
``AppConfig.ready`` in ``apps.py``), never to hide a dependency that runs the wrong way.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PORTAL = Path(__file__).resolve().parents[2] / "portal"

# Lower ranks may be imported by higher ones, never the reverse; equal ranks not at all.
ORDER = {
    "tenants": 0,
    "cluster": 1,
    "accounting": 2,
    "jobs": 3,
    "scheduling": 4,
    "notify": 4,
    "agents": 5,
    "api": 6,
    "web": 6,
}
ANYTHING_GOES = {"ops"}


def apps() -> list[str]:
    return sorted(p.parent.name for p in PORTAL.glob("*/apps.py"))


def imported_modules(node: ast.AST) -> Iterator[tuple[str, int]]:
    """(module, line) for every absolute import under ``node``."""
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name, child.lineno
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            yield child.module, child.lineno
            # `from portal import agents` names the app in the imported name.
            if child.module == "portal":
                for alias in child.names:
                    yield f"portal.{alias.name}", child.lineno


def function_level_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for module, line in imported_modules(node):
                if module == "portal" or module.startswith("portal."):
                    yield module, line


def late_imports_allowed(path: Path) -> bool:
    relative = path.relative_to(PORTAL)
    return (
        path.name in ("tasks.py", "apps.py")
        or "commands" in relative.parts[:-1]
        or "migrations" in relative.parts[:-1]
    )


def app_modules() -> list[Path]:
    return sorted(p for app in apps() for p in (PORTAL / app).rglob("*.py"))


def test_every_app_has_a_place_in_the_order():
    assert sorted(set(apps()) - ANYTHING_GOES) == sorted(ORDER)


@pytest.mark.parametrize("path", app_modules(), ids=lambda p: str(p.relative_to(PORTAL)))
def test_no_app_imports_an_app_above_it(path: Path):
    app = path.relative_to(PORTAL).parts[0]
    if app in ANYTHING_GOES:
        return
    tree = ast.parse(path.read_text(), filename=str(path))
    wrong = []
    for module, line in imported_modules(tree):
        parts = module.split(".")
        if len(parts) < 2 or parts[0] != "portal" or parts[1] not in ORDER or parts[1] == app:
            continue
        other = parts[1]
        if ORDER[other] >= ORDER[app]:
            wrong.append(
                f"portal/{path.relative_to(PORTAL)}:{line} imports {module}: "
                f"{app} may import only apps before it in "
                "tenants -> cluster -> accounting -> jobs -> scheduling, notify -> agents -> api, web"
            )
    assert wrong == []


@pytest.mark.parametrize("path", app_modules(), ids=lambda p: str(p.relative_to(PORTAL)))
def test_portal_imports_inside_functions_only_where_django_needs_them_late(path: Path):
    if late_imports_allowed(path):
        return
    tree = ast.parse(path.read_text(), filename=str(path))
    late = [
        f"portal/{path.relative_to(PORTAL)}:{line} imports {module} inside a function: "
        "import it at the top (only tasks.py, apps.py and management commands import late)"
        for module, line in function_level_imports(tree)
    ]
    assert late == []


def test_modules_outside_the_apps_import_no_app_at_load_time():
    """``portal/*.py`` (settings, celery, passes, policy, ...) sit below every app: apps import
    them, so importing an app back at load time would be a cycle, or would load models before
    Django is set up. ``urls.py`` is the top of everything and may."""
    wrong = []
    for path in sorted(PORTAL.glob("*.py")):
        if path.name == "urls.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom | ast.Try | ast.If):
                for module, line in imported_modules(node):
                    parts = module.split(".")
                    if parts[0] == "portal" and len(parts) > 1 and parts[1] in ORDER:
                        wrong.append(f"portal/{path.name}:{line} imports {module} at load time")
    assert wrong == []


def test_the_checker_sees_imports_at_the_top_and_inside_functions():
    source = (
        "from portal.agents.dispatch import send_launches\n"
        "import portal.scheduling.service\n"
        "from portal import web\n"
        "def late():\n"
        "    from portal.jobs.models import Job\n"
    )
    tree = ast.parse(source)
    assert list(imported_modules(tree)) == [
        ("portal.agents.dispatch", 1),
        ("portal.scheduling.service", 2),
        ("portal", 3),
        ("portal.web", 3),
        ("portal.jobs.models", 5),
    ]
    assert list(function_level_imports(tree)) == [("portal.jobs.models", 5)]
