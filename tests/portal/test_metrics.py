"""/metrics: who may scrape it, the exact value of every family on a small cluster, the
fixed number of queries on a large one, and what a real scheduling pass and real agent
reports make of it."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from portal.agents.models import JobMetrics
from portal.agents.testing import capture_sent_messages, deliver, finished, register_node
from portal.cluster.models import Node
from portal.env import ConfigError, env_networks, env_secret
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import World, allocate, make_job, make_node, make_team, make_user
from portal.ops.metrics import SCRAPE_QUERIES, PortalCollector
from portal.scheduling import service
from portal.scheduling.models import PassTiming, SchedulerState
from portal.scheduling.service import run_schedule_pass
from workers.protocol import Metrics

pytestmark = pytest.mark.django_db

PROJECT = Path(__file__).resolve().parents[2]
S = JobState
TOKEN = "metrics-token-0123456789abcdef"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def samples_of(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def series(samples: Iterable[Sample], name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``name``'s samples keyed by the values of ``labels`` (in that order)."""
    return {tuple(s.labels[k] for k in labels): s.value for s in samples if s.name == name}


def value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def scrape(client: Any, **extra: Any) -> list[Sample]:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples_of(response.content.decode())


def collected_at(now: datetime) -> list[Sample]:
    """The database collector's families, rendered as /metrics renders them, at ``now``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector(now=now))
    return samples_of(generate_latest(registry).decode())


# --- access ----------------------------------------------------------------------------------


def test_it_answers_a_loopback_scraper_by_default(client) -> None:
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200


def test_it_refuses_anyone_else_with_a_short_plain_403(client) -> None:
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 403
    assert response.content == b"forbidden\n"
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    # X-Forwarded-For is anyone's to send: never trusted.
    forwarded = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert forwarded.status_code == 403


def test_with_a_token_only_the_right_bearer_token_gets_in(client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = []
    assert client.get("/metrics").status_code == 403  # loopback no longer enough
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong-token").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {TOKEN}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 403
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert b"# TYPE portal_jobs gauge" in response.content


def test_the_allow_list_admits_its_networks_and_no_others(client, settings) -> None:
    settings.METRICS_ALLOW = networks("10.0.0.0/8,2001:db8::/32")
    assert client.get("/metrics", REMOTE_ADDR="10.200.0.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.200.0.9").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="2001:db8::7").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="11.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="").status_code == 403


def test_a_token_and_an_allow_list_each_let_a_scraper_in(client, settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = networks("10.0.0.0/8")
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.1").status_code == 200
    outside = {"REMOTE_ADDR": "192.0.2.1"}
    assert client.get("/metrics", **outside).status_code == 403
    assert (
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **outside).status_code == 200
    )


def test_only_get_is_answered_and_a_refused_post_learns_nothing(client) -> None:
    allowed = client.post("/metrics")
    assert (allowed.status_code, allowed["Allow"]) == (405, "GET, HEAD")
    refused = client.post("/metrics", REMOTE_ADDR="10.1.2.3")
    assert (refused.status_code, refused.content) == (403, b"forbidden\n")


def networks(text: str) -> list[Any]:
    return [ipaddress.ip_network(item) for item in text.split(",")]


def test_the_allow_list_setting_reads_networks_addresses_and_none(monkeypatch) -> None:
    monkeypatch.setenv("PORTAL_METRICS_ALLOW", " 10.0.0.0/8, ::1,192.168.1.7 ")
    assert [str(n) for n in env_networks("PORTAL_METRICS_ALLOW", [])] == [
        "10.0.0.0/8",
        "::1/128",
        "192.168.1.7/32",
    ]
    for nothing in ("none", "", "NONE"):
        monkeypatch.setenv("PORTAL_METRICS_ALLOW", nothing)
        assert env_networks("PORTAL_METRICS_ALLOW", ["127.0.0.0/8"]) == []
    monkeypatch.delenv("PORTAL_METRICS_ALLOW")
    assert [str(n) for n in env_networks("PORTAL_METRICS_ALLOW", ["127.0.0.0/8"])] == [
        "127.0.0.0/8"
    ]
    monkeypatch.setenv("PORTAL_METRICS_ALLOW", "10.0.0.0/8,localhost")
    with pytest.raises(ConfigError) as refused:
        env_networks("PORTAL_METRICS_ALLOW", [])
    assert str(refused.value) == (
        "PORTAL_METRICS_ALLOW='10.0.0.0/8,localhost': 'localhost' is not a network; expected "
        "comma-separated addresses or CIDR networks such as 127.0.0.1/32,10.0.0.0/8,::1, or none"
    )


def test_a_short_token_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("PORTAL_METRICS_TOKEN", "short")
    with pytest.raises(ConfigError, match="^PORTAL_METRICS_TOKEN: too short; expected at least 16"):
        env_secret("PORTAL_METRICS_TOKEN", min_chars=16)
    monkeypatch.setenv("PORTAL_METRICS_TOKEN", "  ")
    assert env_secret("PORTAL_METRICS_TOKEN", min_chars=16) == ""


def test_a_bad_allow_list_stops_the_portal_at_start_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DATABASE_URL"))}
    env |= {
        "PORTAL_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PORTAL_METRICS_ALLOW": "10.0.0.300",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "portal: configuration error: PORTAL_METRICS_ALLOW='10.0.0.300': '10.0.0.300' is not a "
        "network; expected comma-separated addresses or CIDR networks such as "
        "127.0.0.1/32,10.0.0.0/8,::1, or none"
    ]


# --- every family, exactly -------------------------------------------------------------------


def event(job: Job, from_state: str, to_state: str, attempt: int, message: str = "") -> None:
    JobEvent.objects.create(
        job=job, at=NOW, from_state=from_state, to_state=to_state, attempt=attempt, message=message
    )


def sample_metrics(job: Job, *, util: float | None, age_s: float, attempt: int = 1) -> None:
    JobMetrics.objects.create(
        job=job,
        attempt=attempt,
        gpu_util_pct=util,
        memory_used_mb=1000,
        sampled_at=NOW - timedelta(seconds=age_s),
    )


def small_cluster() -> World:
    """Three teams, three nodes (ready, lost, drained), jobs in every open state, their
    events, the agents' samples and three scheduling passes."""
    world = World()
    make_team("audio", guaranteed_units=0.0, limit_units=None)
    vision, nlp, alice, bob = world.vision, world.nlp, world.alice, world.bob
    make_node(
        "node-1",
        gpus=[
            {"mode": "whole"},
            {"mode": "whole"},
            {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]},
            {"mode": "mps", "shares": 4},
        ],
    )
    make_node("node-2", gpus=[{"mode": "whole"}])
    make_node("node-3", gpus=[{"mode": "whole"}])
    Node.objects.filter(name="node-1").update(last_heartbeat_at=NOW - timedelta(seconds=3))
    Node.objects.filter(name="node-2").update(
        state=Node.State.LOST, last_heartbeat_at=NOW - timedelta(seconds=40)
    )
    Node.objects.filter(name="node-3").update(state=Node.State.DRAINED)

    # vision: two whole GPUs busy at 80 %; one whole GPU on node-2 whose sample is stale;
    # a 1g MIG instance whose only sample is of its earlier attempt (preempted once).
    two_gpus = make_job(team=vision, user=alice, state=S.RUNNING, gpu_count=2)
    allocate(two_gpus, ["GPU-node-1-0", "GPU-node-1-1"])
    sample_metrics(two_gpus, util=80.0, age_s=1)
    event(two_gpus, S.PENDING, S.ASSIGNED, 1)
    event(two_gpus, S.ASSIGNED, S.RUNNING, 1)
    event(two_gpus, S.RUNNING, S.RUNNING, 1, "preemption asked")  # a note, not a preemption
    stale = make_job(team=vision, user=alice, state=S.RUNNING)
    allocate(stale, ["GPU-node-2-0"])
    sample_metrics(stale, util=50.0, age_s=181)  # PORTAL_METRICS_FRESH_S is 180
    event(stale, S.PENDING, S.ASSIGNED, 1)
    second_try = make_job(
        team=vision, user=alice, state=S.RUNNING, attempt=2, gpu_kind="mig", gpu_profile="1g.10gb"
    )
    allocate(second_try, ["MIG-node-1-2-1"])
    sample_metrics(second_try, util=30.0, age_s=1, attempt=1)
    event(second_try, S.PENDING, S.ASSIGNED, 1)
    event(second_try, S.RUNNING, S.PREEMPTED, 1)
    event(second_try, S.PREEMPTED, S.PREEMPTED, 1, "stop sent")
    event(second_try, S.PREEMPTED, S.PENDING, 1)
    event(second_try, S.PENDING, S.ASSIGNED, 2)
    for _ in range(2):
        make_job(team=vision, user=alice, pending_code="QUOTA_LIMIT")
    make_job(team=vision, user=alice)  # no pass has seen it yet
    make_job(team=vision, user=alice, state=S.HELD)
    done = make_job(team=vision, user=alice, state=S.SUCCEEDED)
    allocate(done, ["GPU-node-2-0"], released=True)
    event(done, S.PENDING, S.ASSIGNED, 1)

    # nlp: a 3g MIG instance (no utilisation counter), an MPS share not started yet, and a
    # job preempted before it started, waiting again.
    mig = make_job(team=nlp, user=bob, state=S.RUNNING, gpu_kind="mig", gpu_profile="3g.40gb")
    allocate(mig, ["MIG-node-1-2-0"])
    sample_metrics(mig, util=None, age_s=1)
    event(mig, S.PENDING, S.ASSIGNED, 1)
    mps = make_job(team=nlp, user=bob, state=S.ASSIGNED, gpu_kind="mps")
    allocate(mps, ["GPU-node-1-3/mps/0"])
    event(mps, S.PENDING, S.ASSIGNED, 1)
    event(mps, S.ASSIGNED, S.ASSIGNED, 1, "launch sent again")
    waiting = make_job(team=nlp, user=bob, attempt=1, pending_code="NO_FIT")
    event(waiting, S.PENDING, S.ASSIGNED, 1)
    event(waiting, S.ASSIGNED, S.PREEMPTED, 1)
    event(waiting, S.PREEMPTED, S.PENDING, 1)

    SchedulerState.objects.create(pk=1, passes=7, finished_at=NOW - timedelta(seconds=1))
    for snapshot_ms, decide_ms, apply_ms in [(2, 0.5, 30), (4, 0.5, 120), (12, 3, 700)]:
        PassTiming.objects.create(
            finished_at=NOW, snapshot_ms=snapshot_ms, decide_ms=decide_ms, apply_ms=apply_ms
        )
    return world


def test_every_family_has_its_exact_values_on_a_small_cluster() -> None:
    small_cluster()
    got = collected_at(NOW)

    jobs = series(got, "portal_jobs", "team", "state")
    assert {key: n for key, n in jobs.items() if n} == {
        ("vision", "PENDING"): 3,
        ("vision", "HELD"): 1,
        ("vision", "RUNNING"): 3,
        ("nlp", "PENDING"): 1,
        ("nlp", "ASSIGNED"): 1,
        ("nlp", "RUNNING"): 1,
    }
    # Every team has every open state, zeros included, and nothing ended is counted.
    open_states = ("PENDING", "HELD", "ASSIGNED", "RUNNING", "PREEMPTED", "LOST")
    assert set(jobs) == {(t, s) for t in ("audio", "nlp", "vision") for s in open_states}

    assert series(got, "portal_jobs_pending", "team", "reason") == {
        ("vision", "NEW"): 1,
        ("vision", "QUOTA_LIMIT"): 2,
        ("nlp", "NO_FIT"): 1,
    }
    assert series(got, "portal_team_gpu_units_held", "team") == {
        ("audio",): 0.0,
        ("nlp",): pytest.approx(3 / 7 + 1 / 4),
        ("vision",): pytest.approx(2 + 1 + 1 / 7),
    }
    assert series(got, "portal_team_gpu_units_guaranteed", "team") == {
        ("audio",): 0.0,
        ("nlp",): 1.0,
        ("vision",): 2.0,
    }
    assert series(got, "portal_team_gpu_units_limit", "team") == {
        ("audio",): float("inf"),
        ("nlp",): 3.0,
        ("vision",): 4.0,
    }

    assert series(got, "portal_job_admissions_total", "team") == {
        ("audio",): 0,
        ("nlp",): 3,
        ("vision",): 5,
    }
    assert series(got, "portal_job_preemptions_total", "team") == {
        ("audio",): 0,
        ("nlp",): 1,
        ("vision",): 1,
    }

    assert value(got, "portal_scheduler_passes_total") == 7
    assert value(got, "portal_scheduler_last_pass_timestamp_seconds") == NOW.timestamp() - 1
    phases = series(got, "portal_scheduler_pass_phase_seconds_bucket", "phase", "le")
    bounds = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5"]
    bounds += ["1.0", "2.5", "5.0", "10.0", "+Inf"]
    assert [phases[("snapshot", le)] for le in bounds] == [0, 1, 2, 2] + [3] * 10
    assert [phases[("decide", le)] for le in bounds] == [2, 2, 3] + [3] * 11
    assert [phases[("apply", le)] for le in bounds] == [0, 0, 0, 0, 0, 1, 1, 2, 2] + [3] * 5
    assert series(got, "portal_scheduler_pass_phase_seconds_count", "phase") == {
        ("snapshot",): 3,
        ("decide",): 3,
        ("apply",): 3,
    }
    assert series(got, "portal_scheduler_pass_phase_seconds_sum", "phase") == {
        ("snapshot",): pytest.approx(0.018),
        ("decide",): pytest.approx(0.004),
        ("apply",): pytest.approx(0.85),
    }

    assert {k: v for k, v in series(got, "portal_node_state", "node", "state").items() if v} == {
        ("node-1", "ready"): 1,
        ("node-2", "lost"): 1,
        ("node-3", "drained"): 1,
    }
    assert len(series(got, "portal_node_state", "node", "state")) == 9
    assert series(got, "portal_agent_heartbeat_age_seconds", "node") == {
        ("node-1",): 3.0,
        ("node-2",): 40.0,
    }
    assert series(got, "portal_slice_gpu_utilization_ratio", "node", "gpu", "slice") == {
        ("node-1", "0", "GPU-node-1-0"): 0.8,
        ("node-1", "1", "GPU-node-1-1"): 0.8,
    }


def test_the_endpoint_serves_the_collectors_families_and_request_latency(client) -> None:
    small_cluster()
    client.get("/login/")
    text = client.get("/metrics").content.decode()
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert families == {
        "portal_jobs": "gauge",
        "portal_jobs_pending": "gauge",
        "portal_team_gpu_units_held": "gauge",
        "portal_team_gpu_units_guaranteed": "gauge",
        "portal_team_gpu_units_limit": "gauge",
        "portal_job_admissions": "counter",
        "portal_job_preemptions": "counter",
        "portal_scheduler_passes": "counter",
        "portal_scheduler_last_pass_timestamp_seconds": "gauge",
        "portal_scheduler_pass_phase_seconds": "histogram",
        "portal_node_state": "gauge",
        "portal_agent_heartbeat_age_seconds": "gauge",
        "portal_slice_gpu_utilization_ratio": "gauge",
        "portal_http_request_duration_seconds": "histogram",
        # prometheus_client's creation times of the latency series, a gauge of their own
        "portal_http_request_duration_seconds_created": "gauge",
    }


# --- bounded queries -------------------------------------------------------------------------


def busy_cluster(prefix: str, *, teams: int, nodes: int) -> None:
    """``teams`` teams with a user, a pending and a held job each; ``nodes`` nodes of two
    whole GPUs, each GPU held by a running job with a fresh sample."""
    now = timezone.now()
    made = []
    for t in range(teams):
        team = make_team(f"{prefix}team-{t}")
        user = make_user(f"{prefix}user-{t}", team=team)
        make_job(team=team, user=user, pending_code="FAIR_SHARE")
        make_job(team=team, user=user, state=S.HELD)
        made.append((team, user))
    for n in range(nodes):
        name = f"{prefix}n-{n}"
        make_node(name, gpus=[{"mode": "whole"}, {"mode": "whole"}])
        Node.objects.filter(name=name).update(last_heartbeat_at=now)
        for g in range(2):
            team, user = made[(n * 2 + g) % teams]
            job = make_job(team=team, user=user, state=S.RUNNING)
            allocate(job, [f"GPU-{name}-{g}"])
            JobMetrics.objects.create(
                job=job, attempt=1, gpu_util_pct=40.0, memory_used_mb=1, sampled_at=now
            )
            event(job, S.PENDING, S.ASSIGNED, 1)
    for i in range(3):
        PassTiming.objects.create(finished_at=now, snapshot_ms=i, decide_ms=i, apply_ms=i)


def scrape_queries(client: Any) -> tuple[int, list[Sample]]:
    with CaptureQueriesContext(connection) as queries:
        samples = scrape(client)
    return len(queries), samples


def test_a_scrape_makes_the_same_few_queries_for_a_large_cluster_as_for_a_small_one(
    client,
) -> None:
    busy_cluster("a", teams=2, nodes=2)
    few, small = scrape_queries(client)
    busy_cluster("b", teams=40, nodes=60)  # 42 teams, 62 nodes, 248 jobs on 124 GPUs
    many, large = scrape_queries(client)
    assert few == many == SCRAPE_QUERIES
    assert len(series(large, "portal_slice_gpu_utilization_ratio", "slice")) == 124
    assert len(series(large, "portal_job_admissions_total", "team")) == 42
    assert len(series(small, "portal_agent_heartbeat_age_seconds", "node")) == 2
    assert len(series(large, "portal_agent_heartbeat_age_seconds", "node")) == 62


# --- what real passes and real reports make of it ----------------------------------------------


def test_real_passes_and_agent_reports_show_in_the_metrics(
    client, django_capture_on_commit_callbacks, monkeypatch
) -> None:
    monkeypatch.setattr(service, "PASS_TIMINGS_KEPT", 2)
    world = World()
    register_node("node-1")
    job = make_job(team=world.vision, user=world.alice, gpu_count=2)
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        for _ in range(3):
            assert run_schedule_pass().status == "ran"
    job.refresh_from_db()
    assert (job.state, job.attempt) == (S.ASSIGNED, 1)
    # Each pass keeps only the latest PASS_TIMINGS_KEPT timings.
    assert PassTiming.objects.count() == 2

    # The agent's own sample of the attempt, as it reports it.
    deliver(
        Metrics(
            node="node-1",
            job_id=job.pk,
            attempt=1,
            gpu_util_pct=64.0,
            memory_used_mb=512,
            sampled_at=time.time(),
        ).to_dict()
    )
    got = scrape(client)
    assert value(got, "portal_scheduler_passes_total") == 3
    assert series(got, "portal_scheduler_pass_phase_seconds_count", "phase") == {
        ("snapshot",): 2,
        ("decide",): 2,
        ("apply",): 2,
    }
    assert value(got, "portal_job_admissions_total", team="vision") == 1
    assert value(got, "portal_job_preemptions_total", team="vision") == 0
    assert value(got, "portal_jobs", team="vision", state="ASSIGNED") == 1
    assert value(got, "portal_team_gpu_units_held", team="vision") == 2.0
    held = Allocation.objects.filter(job=job, released_at__isnull=True).select_related("slice__gpu")
    assert series(got, "portal_slice_gpu_utilization_ratio", "node", "gpu", "slice") == {
        ("node-1", str(a.slice.gpu.index), a.slice.key): 0.64 for a in held
    }
    assert 0 <= value(got, "portal_agent_heartbeat_age_seconds", node="node-1") < 60

    # The agent reports the attempt preempted: it is requeued, and counted once.
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        deliver(finished(job.pk, 1, outcome="preempted", exit_code=None))
    job.refresh_from_db()
    assert job.state == S.PENDING
    got = scrape(client)
    assert value(got, "portal_job_preemptions_total", team="vision") == 1
    assert value(got, "portal_team_gpu_units_held", team="vision") == 0.0
    assert series(got, "portal_slice_gpu_utilization_ratio", "slice") == {}


# --- request latency -------------------------------------------------------------------------


def latency_counts(samples: Iterable[Sample]) -> dict[tuple[str, ...], float]:
    return series(samples, "portal_http_request_duration_seconds_count", "view", "method", "status")


def test_request_latency_is_counted_per_view_name_method_and_status(client) -> None:
    before = latency_counts(scrape(client))
    assert client.get("/login/").status_code == 200
    assert client.get("/jobs/12345/").status_code == 302  # to the login page
    assert client.get("/no-such-page/").status_code == 404
    assert client.generic("BREW", "/login/").status_code == 405
    after = latency_counts(scrape(client))
    grew = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key)}
    assert grew == {
        ("metrics", "GET", "200"): 1,  # the first scrape
        ("web:login", "GET", "200"): 1,
        ("web:job_detail", "GET", "302"): 1,
        ("unmatched", "GET", "404"): 1,
        ("web:login", "other", "405"): 1,
    }


def test_in_multiprocess_mode_a_scrape_adds_up_every_web_workers_requests(
    client, tmp_path: Path, monkeypatch
) -> None:
    observe = (
        "from portal.ops.request_metrics import REQUEST_LATENCY\n"
        "REQUEST_LATENCY.labels('api:job_list', 'GET', '200').observe(0.2)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _worker in range(2):
        subprocess.run(
            [sys.executable, "-c", observe], env=env, cwd=PROJECT, check=True, timeout=120
        )
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    got = scrape(client)
    key = {"view": "api:job_list", "method": "GET", "status": "200"}
    assert value(got, "portal_http_request_duration_seconds_count", **key) == 2
    assert value(got, "portal_http_request_duration_seconds_sum", **key) == pytest.approx(0.4)
    assert value(got, "portal_http_request_duration_seconds_bucket", le="0.1", **key) == 0
    assert value(got, "portal_http_request_duration_seconds_bucket", le="0.25", **key) == 2
    # The database families are there too.
    assert value(got, "portal_scheduler_passes_total") == 0
