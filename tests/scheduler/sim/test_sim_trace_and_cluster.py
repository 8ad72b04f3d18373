"""Reading traces and quotas, and describing the simulated cluster and its teams."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from scheduler.model import SliceKind
from scheduler.sim.cluster import ClusterError, ClusterSpec, apportion, build_nodes, build_teams
from scheduler.sim.trace import TraceError, load_trace, parse_quotas, parse_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def rows(text: str) -> list[dict[str, str]]:
    import csv

    return list(csv.DictReader(io.StringIO(text)))


def test_it_reads_the_philly_layout_sorted_by_submit_time() -> None:
    jobs = parse_trace(
        rows("job_id,submit_s,duration_s,gpus,tenant\nb,20,5,2,t1\na,10,7,1,t2\nc,10,1,4,t1\n")
    )
    assert [(j.id, j.tenant, j.gpus, j.submit_s, j.duration_s) for j in jobs] == [
        ("a", "t2", 1, 10, 7),
        ("c", "t1", 4, 10, 1),
        ("b", "t1", 2, 20, 5),
    ]


def test_it_reads_the_tiresias_layout_into_one_default_team() -> None:
    jobs = load_trace(FIXTURES / "tiresias_60_job.csv")
    assert len(jobs) == 60
    assert {j.tenant for j in jobs} == {"default"}
    assert (jobs[1].id, jobs[1].gpus, jobs[1].submit_s, jobs[1].duration_s) == ("1", 8, 30, 147)


def test_limit_jobs_keeps_the_first_rows_of_the_file() -> None:
    assert [j.id for j in load_trace(FIXTURES / "tiresias_60_job.csv", limit=3)] == ["0", "1", "2"]
    with pytest.raises(TraceError, match="limit-jobs must be a positive"):
        load_trace(FIXTURES / "tiresias_60_job.csv", limit=0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,when\n1,2\n", "header must hold job_id,submit_s,duration_s,gpus,tenant"),
        ("job_id,submit_s,duration_s,gpus,tenant\na,0,5,0,t\n", "line 2: gpus must be a whole"),
        ("job_id,submit_s,duration_s,gpus,tenant\na,0,5,1.5,t\n", "gpus must be a whole"),
        ("job_id,submit_s,duration_s,gpus,tenant\na,x,5,1,t\n", "line 2: submit_s must be a num"),
        ("job_id,submit_s,duration_s,gpus,tenant\na,0,-1,1,t\n", "duration must be >= 0"),
        ("job_id,submit_s,duration_s,gpus,tenant\na,0,1,1,t\na,0,1,1,t\n", "line 3: job_id 'a'"),
        ("job_id,submit_s,duration_s,gpus,tenant\n", "the trace has no jobs"),
    ],
)
def test_it_rejects_a_bad_trace_naming_the_row_and_field(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_trace(rows(text))


def test_it_reads_quotas_and_rejects_bad_rows() -> None:
    assert parse_quotas(rows("vc,node num\nx,64\ny,8\n")) == {"x": 64, "y": 8}
    with pytest.raises(TraceError, match="node num must be > 0"):
        parse_quotas(rows("vc,node num\nx,0\n"))
    with pytest.raises(TraceError, match="quota header must hold vc,node num"):
        parse_quotas(rows("team,nodes\nx,1\n"))


def test_nodes_take_whole_gpus_and_the_last_node_the_remainder() -> None:
    nodes = build_nodes(ClusterSpec(20, 8))
    assert [len(n.slices) for n in nodes] == [8, 8, 4]
    assert nodes[2].slices[3].id == "n002/g3"


def test_mig_nodes_split_every_gpu_by_the_layout() -> None:
    nodes = build_nodes(ClusterSpec(10, 8, mig_nodes=1, mig_layout=("3g.40gb", "4g.40gb")))
    mig = nodes[1].slices
    assert [(s.id, s.kind, s.profile) for s in mig[:2]] == [
        ("n001/g0/m0", SliceKind.MIG, "3g.40gb"),
        ("n001/g0/m1", SliceKind.MIG, "4g.40gb"),
    ]
    assert sum(s.units for s in mig) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dict(gpus=0), "--gpus must be >= 1"),
        (dict(gpus=8, gpus_per_node=0), "--gpus-per-node must be >= 1"),
        (dict(gpus=16, mig_nodes=3), "--mig-nodes must be between 0 and the 2 nodes"),
        (dict(gpus=8, mig_nodes=1, mig_layout=("4g.40gb", "4g.40gb")), "more than the 7"),
        (dict(gpus=8, mig_nodes=1, mig_layout=("9g.1gb",)), "unknown MIG profile"),
    ],
)
def test_it_rejects_a_bad_cluster_naming_the_option(spec: dict, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        ClusterSpec(**spec)


def test_guarantees_keep_the_quota_proportions_and_add_up_to_the_cluster() -> None:
    # Quotas 64 : 32 : 1 (default) nodes over 97 -> 512 GPUs: 337.8, 168.9, 5.3 -> 338, 169, 5.
    teams = build_teams(["big", "mid", "new", "big"], {"big": 64, "mid": 32}, 512)
    assert {n: t.guaranteed_gpus for n, t in teams.items()} == {"big": 338, "mid": 169, "new": 5}
    assert [n for n, t in teams.items() if t.defaulted] == ["new"]
    assert teams["new"].weight == 1.0


def test_without_a_quota_table_teams_are_equal() -> None:
    teams = build_teams(["a", "b", "c"], None, 8)
    assert {n: t.guaranteed_gpus for n, t in teams.items()} == {"a": 3, "b": 3, "c": 2}
    assert not any(t.defaulted for t in teams.values())


def test_apportion_breaks_remainder_ties_by_name() -> None:
    assert apportion({"b": 1, "a": 1}, 3) == {"a": 2, "b": 1}
