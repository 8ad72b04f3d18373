"""Recompute the recovery figures of a saved chaos run: `python -m tests.chaos.refigure
test-results/chaos.json` (for a results file written before a figure was added)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from tests.chaos.checks import NodeChange, recovery_figures
from tests.chaos.faults import Fault
from tests.chaos.truth import Execution, Truth


def figures_of(result: dict[str, Any]) -> dict[str, Any]:
    fault_fields = {f.name for f in dataclasses.fields(Fault)}
    run_fields = {f.name for f in dataclasses.fields(Execution)}
    faults = [Fault(**{k: v for k, v in f.items() if k in fault_fields}) for f in result["faults"]]
    changes = [NodeChange(**c) for c in result["node_changes"]]
    executions = [
        Execution(**{k: v for k, v in e.items() if k in run_fields}) for e in result["executions"]
    ]
    # Each agent's work directory, from where its jobs ran (`<workdir>/jobs/<job>-<attempt>`).
    workdirs = {
        e["node"]: e["cwd"].split("/jobs/")[0] for e in result["executions"] if "/jobs/" in e["cwd"]
    }
    return recovery_figures(
        faults=faults, changes=changes, truth=Truth(executions=executions), workdirs=workdirs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, help="a chaos results file (JSON)")
    figures = figures_of(json.loads(parser.parse_args().results.read_text()))
    figures.pop("per_fault")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
