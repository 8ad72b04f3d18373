"""The scheduling core stays pure: nothing under scheduler/ imports the web or worker stack."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FORBIDDEN = {"django", "celery", "portal", "workers", "rest_framework", "redis", "psycopg"}
PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"
FILES = sorted(PACKAGE.rglob("*.py"))


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif _is_dunder_import(node):
            assert isinstance(node, ast.Call)
            roots.add(str(node.args[0].value).split(".")[0])  # type: ignore[attr-defined]
    return roots


def _is_dunder_import(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "__import__"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
    )


def test_the_package_has_files_to_check() -> None:
    assert PACKAGE / "core.py" in FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_scheduler_module_imports_the_web_or_worker_stack(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    assert _imported_roots(tree) & FORBIDDEN == set()


def test_the_checker_sees_every_import_form() -> None:
    tree = ast.parse("import django.db\nfrom celery import Celery\n__import__('redis')\n")
    assert _imported_roots(tree) == {"django", "celery", "redis"}
