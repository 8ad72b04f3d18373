"""What the README and the docs say of the client and the command line exists: every
`gpu-portal` command line of their shell blocks parses, every command and flag of the
command table is the parser's, every `portal.X` / `job.X` they name is the client's.
(The requests the examples send are checked against the demo inventory in
tests/portal/test_submit_cluster_fit.py.)"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from portal_client import Job, PortalClient
from portal_client.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/client.md", "docs/api.md")


def command_lines(document: str) -> list[list[str]]:
    text = (ROOT / document).read_text(encoding="utf-8")
    lines: list[list[str]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("gpu-portal "):
                lines.append(shlex.split(line, comments=True)[1:])
    return lines


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_documented_command_line_parses(document: str) -> None:
    lines = command_lines(document)
    for argv in lines:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{document}: `gpu-portal {shlex.join(argv)}` does not parse")
    assert lines or document == "docs/api.md"


def test_the_command_table_names_every_command_and_only_flags_they_take() -> None:
    text = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    table = text.split("| command | does |", 1)[1].split("\n\n", 1)[0]
    parsers = subcommands()
    documented: set[str] = set()
    for row in table.splitlines()[2:]:
        usage, does = row.strip("|").split(" | ", 1)
        names = [cell.split()[0] for cell in re.findall(r"`([^`]+)`", usage)]
        documented.update(names)
        flags = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage + does))
        for name in names:
            assert name in parsers, f"docs/client.md: no command {name!r}"
            unknown = flags - set(parsers[name]._option_string_actions)
            assert not unknown, f"docs/client.md: `{name}` takes no {sorted(unknown)}"

    assert documented == set(parsers)


def test_every_client_method_and_job_attribute_the_docs_name_exists() -> None:
    named: dict[str, set[str]] = {"portal": set(), "job": set()}
    for document in DOCUMENTS:
        text = (ROOT / document).read_text(encoding="utf-8")
        # Calls only for the client: `portal.scheduling`, `portal.jobs.models` are modules.
        for name in re.findall(r"\b(?:portal|PortalClient)\.([a-z_]+)\(", text):
            named["portal"].add(name)
        for name in re.findall(r"\bjob\.([a-z_]+)\b", text):
            if name not in ("yaml", "json"):  # the request files job.yaml and job.json
                named["job"].add(name)
    table = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    table = table.split("| attribute | what |", 1)[1].split("\n\n", 1)[0]
    named["job"] |= {name for cell in re.findall(r"^\| (.*?) \|", table, re.M)
                     for name in re.findall(r"`(\w+)`", cell)}  # fmt: skip

    assert {"submit", "wait", "from_env", "follow_log"} <= named["portal"]
    assert {"wait", "logs", "state", "reason", "eta", "slice"} <= named["job"]
    job = Job(PortalClient("http://127.0.0.1:9/", "token"), {"id": 1, "state": "PENDING"})
    assert named["portal"] - set(dir(PortalClient)) == set()
    assert named["job"] - set(dir(job)) == set()  # `data` is the instance's
