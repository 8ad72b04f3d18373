"""The simulator driving the real core on the Tiresias toy trace, against hand computation."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scheduler.sim.__main__ import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOY = FIXTURES / "tiresias_60_job.csv"

# The first 10 jobs of the toy trace (id: GPUs, submit s, duration s):
#   0: 1, 0, 164    1: 8, 30, 147   2: 2, 53, 127   3: 1, 79, 121   4: 4, 99, 121
#   5: 8, 132, 138  6: 1, 176, 121  7: 2, 204, 124  8: 2, 227, 155  9: 1, 252, 126
#
# One node of 8 GPUs, strict FIFO (no backfill):
#   t=0    job0 starts (7 free), ends 164.
#   t=30   job1 needs 8, only 7 free: it heads the queue and blocks jobs 2..9 behind it.
#   t=164  job0 ends; job1 starts, ends 311.
#   t=311  job2 (2), job3 (1), job4 (4) start (1 free); job5 (8) blocks. Ends: job3 and
#          job4 at 432, job2 at 438.
#   t=432  6 free, job5 still blocked.  t=438: job5 starts, ends 576.
#   t=576  jobs 6, 7, 8, 9 start; they end at 697, 700, 731, 702.
FIFO_STARTS = [0, 164, 311, 311, 311, 438, 576, 576, 576, 576]
# Waits (start - submit): 0, 134, 258, 232, 212, 306, 400, 372, 349, 324 -> sum 2587.
FIFO_MEAN_WAIT = 258.7
# Work: 164 + 8x147 + 2x127 + 121 + 4x121 + 8x138 + 121 + 2x124 + 2x155 + 126 = 4108 GPU-s.
# Utilisation = 4108 / (8 x 731) ; offered load = 4108 / (8 x (252 - 0)).
# Makespan bound: max(submit + duration) = 382 (job8); t + work submitted at or after t over
# 8 GPUs: t=0: 513.5, t=30: 30 + 3944/8 = 523, t=53: 53 + 2768/8 = 399, later ones less -> 523.
# Utilisation bound = 4108 / (8 x 523).
#
# With backfill the only change is job6: at t=311 job5 (8 GPUs) reserves the node for t=438
# (when job2 ends); job6 needs 1 GPU for 121 s and ends at 432 <= 438, so it runs 311..432.
# Its wait drops from 400 to 135: mean (2587 - 265) / 10 = 232.2.
BACKFILL_STARTS = [0, 164, 311, 311, 311, 438, 311, 576, 576, 576]


def replay_toy(tmp_path: Path, policy: str, *extra: str) -> tuple[dict, list[dict[str, str]]]:
    out_json, out_csv = tmp_path / f"{policy}.json", tmp_path / f"{policy}.csv"
    args = ["--trace", str(TOY), "--policy", policy, "--json", str(out_json)]
    args += ["--jobs-out", str(out_csv), *extra]
    assert main(args) == 0
    with open(out_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return json.loads(out_json.read_text()), rows


def test_fifo_on_eight_gpus_matches_the_hand_computation(tmp_path: Path) -> None:
    report, rows = replay_toy(tmp_path, "fifo", "--gpus", "8", "--limit-jobs", "10")
    assert [float(r["start_s"]) for r in sorted(rows, key=lambda r: int(r["job_id"]))] == (
        FIFO_STARTS
    )
    assert report["mean_wait_s"] == FIFO_MEAN_WAIT
    assert report["makespan_s"] == 731
    assert report["utilisation"] == round(4108 / (8 * 731), 4)
    assert report["utilisation_bound"] == round(4108 / (8 * 523), 4)
    assert report["offered_load"] == round(4108 / (8 * 252), 4)
    assert report["p50_wait_s"] == 282.0  # waits sorted: ...258, 306...: (258 + 306) / 2


def test_fifo_with_backfill_runs_the_one_job_that_ends_before_the_reservation(
    tmp_path: Path,
) -> None:
    report, rows = replay_toy(tmp_path, "fifo_backfill", "--gpus", "8", "--limit-jobs", "10")
    assert [float(r["start_s"]) for r in sorted(rows, key=lambda r: int(r["job_id"]))] == (
        BACKFILL_STARTS
    )
    assert report["mean_wait_s"] == 232.2


@pytest.mark.parametrize("policy", ["fairshare", "fifo", "fifo_backfill", "private"])
def test_the_report_holds_the_documented_keys(tmp_path: Path, policy: str) -> None:
    report, _ = replay_toy(tmp_path, policy, "--gpus", "16")
    for key in [
        "policy",
        "gpus",
        "jobs",
        "mean_wait_s",
        "p50_wait_s",
        "p99_wait_s",
        "mean_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "makespan_s",
        "utilisation",
        "utilisation_bound",
        "offered_load",
        "jain_waiting",
        "teams",
    ]:
        assert key in report, key
    assert report["jobs"] == 60
    assert set(report["teams"]["default"]) >= {"share", "entitlement", "mean_wait_s", "jobs"}
    if policy == "private":
        assert report["excluded_jobs"] == 0
    else:
        assert report["sharing_incentive"]["teams"]["default"]["holds"] in (True, False)


def test_the_cli_names_a_bad_option_value(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--trace", str(TOY), "--gpus", "0"]) == 2
    assert "--gpus must be >= 1" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.csv"), "--gpus", "8"]) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_mig_jobs_run_on_mig_nodes_and_count_their_units(tmp_path: Path) -> None:
    trace = tmp_path / "mig.csv"
    trace.write_text(
        "job_id,submit_s,duration_s,gpus,tenant,mig_profile\n"
        "w1,0,100,8,a,\nm1,0,100,2,a,1g.10gb\nm2,10,50,1,b,3g.40gb\n"
    )
    out = tmp_path / "segments.csv"
    args = ["--trace", str(trace), "--gpus", "16", "--mig-nodes", "1", "--jobs-out", str(out)]
    assert main(args) == 0
    with open(out, newline="") as handle:
        rows = {r["job_id"]: r for r in csv.DictReader(handle)}
    # Two 1g instances are 2/7 of a GPU, one 3g instance 3/7; all start on arrival.
    assert [rows[j]["gpus"] for j in ("w1", "m1", "m2")] == ["8", repr(2 / 7), repr(3 / 7)]
    assert [rows[j]["start_s"] for j in ("w1", "m1", "m2")] == ["0", "0", "10"]
