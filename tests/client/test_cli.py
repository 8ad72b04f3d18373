"""`gpu-portal`, the installed command, run in a subprocess against Django's live server:
what it prints, what it stores, and its exit codes (0 ok, 1 failed job, 2 usage, 3 portal,
4 wait timed out). tests/client/test_live_stack.py runs it on real jobs."""

from __future__ import annotations

import json
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Cli
from django.utils import timezone

from portal.jobs.models import Allocation, Job, JobLogChunk, JobState
from portal.jobs.testing import World, allocate, make_job, make_node
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.usefixtures("transactional_db")


@pytest.fixture(autouse=True)
def no_scheduling_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker here: a submit's pass is dropped (the live-stack tests run real ones)."""
    monkeypatch.setattr("portal.passes.request_schedule_pass", lambda: None)


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def cli(live_server: Any, world: World, tmp_path: Path) -> Cli:
    return Cli(live_server.url, token_issue(user=world.alice), tmp_path / "gpu-portal" / "c.json")


# --- login ---------------------------------------------------------------------------------


def test_login_checks_the_token_saves_it_for_me_only_and_later_commands_use_it(cli: Cli) -> None:
    refused = cli("login", "--url", cli.url, stdin="not-a-token\n", logged_in=False)
    assert refused.returncode == 3
    assert "unknown or revoked token" in refused.stderr
    assert not cli.config.exists()

    done = cli("login", "--url", cli.url, stdin=cli.token + "\n", logged_in=False)

    assert done.returncode == 0, done.stderr
    assert f"token saved in {cli.config} (mode 0600); teams: vision" in done.stdout
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(cli.config.parent.stat().st_mode) == 0o700
    assert json.loads(cli.config.read_text()) == {"url": cli.url, "token": cli.token}
    teams = cli("teams", logged_in=False)
    assert teams.returncode == 0, teams.stderr
    assert teams.stdout.splitlines()[1].split()[0] == "vision"


# --- jobs ----------------------------------------------------------------------------------


def test_submit_with_flags_stores_every_field_and_prints_the_id(cli: Cli, world: World) -> None:
    first = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED)

    done = cli(
        "submit", "-q", "--team", "vision", "--image", "python:3.11-slim",
        "--gpu", "mig", "--profile", "1g.10gb", "--count", "1", "--priority", "low",
        "--time-limit", "1h30m", "--no-preemptible", "-e", "SEED=7", "-e", "MODE=fast",
        "--after-any", str(first.pk), "--notify", "fail,end",
        "--", "python3", "-c", "print('hi')",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    job = Job.objects.get(pk=int(done.stdout))
    assert (job.name, job.team.name, job.user.username, job.command) == (
        "python3",  # no --name: the program's name, like sbatch
        "vision",
        "alice",
        ["python3", "-c", "print('hi')"],
    )
    assert (job.gpu_kind, job.gpu_profile, job.gpu_count, job.priority) == (
        "mig",
        "1g.10gb",
        1,
        "low",
    )
    assert (job.time_limit_s, job.preemptible, job.env) == (
        5400,
        False,
        {"SEED": "7", "MODE": "fast"},
    )
    assert [(d.depends_on_id, d.kind) for d in job.dependencies.all()] == [(first.pk, "after_any")]
    assert job.notify == ["end", "fail"]


def test_submit_reads_a_yaml_or_json_file_and_flags_win(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: from-file\nteam: vision\nimage: python:3.11-slim\n"
        'command: [python3, -c, "print(1)"]\ngpu: {kind: mig, profile: 1g.10gb}\n'
        "env: {A: '1'}\n"
    )
    as_json = tmp_path / "job.json"
    as_json.write_text(json.dumps({**{"name": "json", "team": "vision"}, "image": "busybox"}))

    from_yaml = cli.json("submit", "-f", str(spec), "--name", "renamed", "-e", "B=2")
    from_json = cli("submit", "-f", str(as_json), "--gpu", "mps", "--", "true")

    assert from_yaml["name"] == "renamed"
    assert from_yaml["env"] == {"A": "1", "B": "2"}
    assert from_yaml["gpu"]["profile"] == "1g.10gb"
    assert from_json.returncode == 0, from_json.stderr
    assert Job.objects.filter(name="json", image="busybox", gpu_kind="mps").exists()


def test_ls_show_hold_release_cancel_and_resubmit(cli: Cli, world: World) -> None:
    job = make_job(
        team=world.vision,
        user=world.alice,
        name="waiting",
        pending_code="QUOTA_LIMIT",
        pending_message="team uses 4 of 4 units, job needs 1",
        queue_position=2,
    )
    other = make_job(team=world.nlp, user=world.bob, name="not-mine")

    table = cli("ls")
    listed = cli.json("ls", "--state", "pending")
    shown = cli("show", str(job.pk))

    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TEAM", "USER", "STATE", "GPU", "WHY", "/", "WHERE", "ELAPSED"]  # fmt: skip
    assert row.split()[:7] == [str(job.pk), "waiting", "vision", "alice", "PENDING", "whole", "x1"]
    assert "QUOTA_LIMIT #2" in row
    assert [item["id"] for item in listed] == [job.pk]
    assert other.name not in table.stdout
    assert "reason           QUOTA_LIMIT: team uses 4 of 4 units, job needs 1" in shown.stdout
    assert "queue position   2" in shown.stdout

    held = cli("hold", str(job.pk))
    released = cli.json("release", str(job.pk))
    cancelled = cli("cancel", str(job.pk))
    again = cli.json("resubmit", str(job.pk))

    assert (held.returncode, held.stdout.split()[:3]) == (0, ["job", str(job.pk), "HELD"])
    assert [item["state"] for item in released] == ["PENDING"]
    assert cancelled.stdout.split()[:3] == ["job", str(job.pk), "CANCELLED"]
    assert (again["state"], again["name"]) == ("PENDING", "waiting")
    assert again["id"] != job.pk


def test_logs_prints_the_log_and_follow_exits_by_the_jobs_result(cli: Cli, world: World) -> None:
    good = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED, exit_code=0)
    bad = make_job(
        team=world.vision, user=world.alice, state=JobState.FAILED, exit_code=2, reason="exit 2"
    )
    for job, text in ((good, "all good\n"), (bad, "Traceback ...\n")):
        JobLogChunk.objects.create(job=job, attempt=1, seq=0, data=text)

    whole = cli("logs", str(good.pk))
    followed_good = cli("logs", "-f", str(good.pk))
    followed_bad = cli("logs", "-f", str(bad.pk))

    assert (whole.returncode, whole.stdout) == (0, "all good\n")
    assert (followed_good.returncode, followed_good.stdout) == (0, "all good\n")
    assert (followed_bad.returncode, followed_bad.stdout) == (1, "Traceback ...\n")
    assert f"job {bad.pk} FAILED · exit 2 (exit 2)" in followed_bad.stderr


def test_wait_exits_0_when_the_job_succeeded_1_when_it_failed_4_on_timeout(
    cli: Cli, world: World
) -> None:
    good = make_job(team=world.vision, user=world.alice, state=JobState.SUCCEEDED, exit_code=0)
    bad = make_job(team=world.vision, user=world.alice, state=JobState.TIMED_OUT)
    waiting = make_job(team=world.vision, user=world.alice, pending_code="NO_FIT")

    assert cli("wait", str(good.pk)).returncode == 0
    assert cli("wait", str(bad.pk)).returncode == 1
    timed_out = cli("wait", str(waiting.pk), "--timeout", "1", "--poll", "0.2")
    assert timed_out.returncode == 4
    assert f"job {waiting.pk} still PENDING (NO_FIT" in timed_out.stderr
    reached = cli("wait", str(waiting.pk), "--state", "pending")
    assert (reached.returncode, reached.stdout.split()[:3]) == (0, ["job", str(waiting.pk), "PENDING"])  # fmt: skip


def test_teams_and_usage_show_gpu_hours_used_and_holdings_against_the_quota(
    cli: Cli, world: World
) -> None:
    make_node("node-a", gpus=[{"model": "NVIDIA A100"}])
    running = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)
    allocate(running, ["GPU-node-a-0"])
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Allocation.objects.filter(job=running).update(created_at=two_hours_ago)

    teams = cli.json("teams")
    usage = cli("usage", "vision")
    as_json = cli.json("usage")  # every team of mine
    bad_day = cli("usage", "--from", "2024-13-01")
    today = f"{timezone.now():%Y-%m-%d}"
    one_day = cli.json("usage", "vision", "--from", today, "--to", today)

    assert [team["name"] for team in teams] == ["vision"]
    assert usage.returncode == 0, usage.stderr
    lines = usage.stdout.splitlines()
    assert lines[0].startswith("GPU-unit-hours from ")
    team_row, member_row = lines[2].split(), lines[5].split()
    # Used over the last 30 days; budget and left (none); held, guarantee, limit, borrowed.
    assert team_row[0] == "vision" and float(team_row[1]) == pytest.approx(2.0, abs=0.05)
    assert team_row[3:] == ["-", "-", "1", "2", "4", "0"]
    assert member_row[:2] == ["alice", "member"]  # alice sees herself only
    assert float(member_row[2]) == pytest.approx(2.0, abs=0.05)
    assert "only you" in usage.stdout
    (report,) = as_json
    assert (report["team"], report["quota"]["held_units"]) == ("vision", 1.0)
    assert len(report["days"]) == 30  # the API's default range: 30 days up to today
    assert [day["date"] for day in one_day[0]["days"]] == [today]
    assert bad_day.returncode == 2
    assert "'2024-13-01' is not a date; allowed: YYYY-MM-DD" in bad_day.stderr


# --- exit codes for what goes wrong --------------------------------------------------------


def test_a_usage_error_exits_2(cli: Cli) -> None:
    unknown_flag = cli("ls", "--colour")
    bad_count = cli("submit", "--count", "0", "--", "true")
    bad_state = cli("ls", "--state", "done")
    not_logged_in = cli("teams", logged_in=False)

    assert unknown_flag.returncode == bad_count.returncode == bad_state.returncode == 2
    assert "'0' is not a whole number of at least 1" in bad_count.stderr
    assert "--state: unknown DONE; allowed: ASSIGNED" in bad_state.stderr
    assert not_logged_in.returncode == 2
    assert "PORTAL_URL and PORTAL_TOKEN not set" in not_logged_in.stderr
    assert "gpu-portal login" in not_logged_in.stderr


def test_what_the_portal_refuses_exits_3_with_its_message(cli: Cli, world: World) -> None:
    done = make_job(team=world.vision, user=world.alice, state=JobState.CANCELLED)

    bad_request = cli(
        "submit", "--team", "vision", "--image", "python:3.11-slim", "--gpu", "mig",
        "--profile", "1g.11gb", "--", "true",
    )  # fmt: skip
    missing = cli("show", "999999")
    conflict = cli("cancel", str(done.pk))
    as_json = cli("show", "999999", "--json")
    bad_token = cli("ls", PORTAL_TOKEN="not-a-token")

    assert bad_request.returncode == missing.returncode == conflict.returncode == 3
    assert "gpu.profile: unknown MIG profile '1g.11gb'" in bad_request.stderr
    assert "no job 999999 among the jobs of your teams" in missing.stderr
    assert f"job {done.pk} already ended (CANCELLED)" in conflict.stderr
    assert as_json.returncode == 3
    assert json.loads(as_json.stderr)["errors"] == {
        "detail": "no job 999999 among the jobs of your teams"
    }
    assert (bad_token.returncode, as_json.stdout) == (3, "")


def test_an_unreachable_portal_exits_3_naming_the_url(cli: Cli) -> None:
    done = cli("ls", PORTAL_URL="http://127.0.0.1:9")  # the discard port: nothing listens

    assert done.returncode == 3
    assert "cannot reach the portal at http://127.0.0.1:9/api/v1/jobs/" in done.stderr
