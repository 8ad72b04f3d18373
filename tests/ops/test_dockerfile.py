"""The Dockerfile cannot be built here (no Docker engine); check what can be checked without one."""

from __future__ import annotations

from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
DOCKERFILE = (PROJECT / "Dockerfile").read_text()


def instructions(name: str) -> list[list[str]]:
    return [line.split()[1:] for line in DOCKERFILE.splitlines() if line.startswith(name + " ")]


def test_every_file_it_copies_is_in_the_repository_and_not_docker_ignored() -> None:
    ignored = {
        line.strip()
        for line in (PROJECT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for args in instructions("COPY"):
        for source in args[:-1]:
            assert (PROJECT / source).exists(), f"COPY {source}: no such file"
            assert source not in ignored, f"COPY {source}: excluded by .dockerignore"


def test_it_builds_on_python_311_slim_and_runs_as_a_non_root_user() -> None:
    assert instructions("FROM") == [["python:3.11-slim"]]
    (user,) = instructions("USER")
    assert user != ["root"] and user != ["0"]
    assert "pip install ." in DOCKERFILE
    assert "collectstatic --noinput" in DOCKERFILE
