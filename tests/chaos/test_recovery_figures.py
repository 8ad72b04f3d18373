"""The recovery figures of a chaos run, on a hand-made history (no stack)."""

from __future__ import annotations

from tests.chaos.checks import NodeChange, recovery_figures
from tests.chaos.faults import Fault
from tests.chaos.truth import Execution, Truth

WORKDIRS = {"n1": "/w/n1", "n2": "/w/n2"}


def run(job_id: int, attempt: int, node: str, started: float, end: float | None) -> Execution:
    return Execution(
        job_id=job_id, attempt=attempt, pid=100 + job_id, started=started,
        cwd=f"{WORKDIRS[node]}/jobs/{job_id}-{attempt}/work", end=end,
    )  # fmt: skip


def test_agent_faults_near_a_control_plane_fault_are_counted_apart() -> None:
    faults = [
        # A quiet kill of n1 at t=100: node lost 11 s later, its job running on n2 at +14 s.
        Fault(0, 0.0, "kill_agent", "n1", 5.0, injected_at=100.0),
        # A kill of n2 at t=300 while the control worker is down (t=310): lost at +19 s,
        # its job running again at +40 s.
        Fault(1, 0.0, "kill_agent", "n2", 5.0, injected_at=300.0),
        Fault(2, 0.0, "kill_worker", "worker", 3.0, injected_at=310.0),
        # A dropped message next to the first kill does not make it less quiet.
        Fault(3, 0.0, "drop_message", "control", 0.0, injected_at=105.0),
    ]
    changes = [NodeChange(111.0, "n1", "lost"), NodeChange(319.0, "n2", "lost")]
    truth = Truth(
        executions=[
            run(1, 0, "n1", 90.0, None),
            run(1, 1, "n2", 114.0, 150.0),
            run(2, 0, "n2", 290.0, None),
            run(2, 1, "n1", 340.0, 360.0),
        ]
    )
    figures = recovery_figures(faults=faults, changes=changes, truth=truth, workdirs=WORKDIRS)
    assert figures["fault_to_node_lost_s"] == {
        "n": 2, "min": 11.0, "median": 15.0, "p90": 19.0, "max": 19.0
    }  # fmt: skip
    assert figures["quiet_fault_to_node_lost_s"]["n"] == 1
    assert figures["quiet_fault_to_node_lost_s"]["max"] == 11.0
    assert figures["quiet_fault_to_job_running_again_s"]["max"] == 14.0
    assert figures["fault_to_job_running_again_s"]["max"] == 40.0
    assert [f["quiet"] for f in figures["per_fault"]] == [True, False]
