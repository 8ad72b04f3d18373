"""Trace-replay simulator: the same ``scheduler.schedule()`` on a simulated clock.

``python -m scheduler.sim --help`` for the command line; ``docs/simulator.md`` for the
definitions of every figure it reports.
"""

from scheduler.sim.cluster import ClusterSpec, TeamSpec, build_nodes, build_teams
from scheduler.sim.engine import ScheduleFn, SimResult, SimulationError, replay
from scheduler.sim.records import JobRecord, Segment
from scheduler.sim.runner import POLICIES, Scenario, run_private, simulate
from scheduler.sim.trace import TraceJob, load_quotas, load_trace

__all__ = [
    "POLICIES",
    "ClusterSpec",
    "JobRecord",
    "Scenario",
    "ScheduleFn",
    "Segment",
    "SimResult",
    "SimulationError",
    "TeamSpec",
    "TraceJob",
    "build_nodes",
    "build_teams",
    "load_quotas",
    "load_trace",
    "replay",
    "run_private",
    "simulate",
]
