"""What the control plane does with each agent report: registration and inventory,
started / log / finished / metrics, repeats, stale attempts, bad messages, reconciliation."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.accounting.models import UsageBalance, UsageRecord
from portal.cluster.models import Allocation, Gpu, JobMetrics, Node, Slice
from portal.cluster.tasks import agent_report
from portal.cluster.testing import (
    capture_sent_messages,
    finished,
    heartbeat,
    log_chunk,
    register_node,
    started,
)
from portal.jobs.models import Job, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.inventory import stable_uuid
from workers.protocol import Metrics

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU0 = stable_uuid("GPU", NODE, 0)


@pytest.fixture
def team_and_user():
    team = make_team("vision", limit_units=None)
    return team, make_user("alice", team=team)


@pytest.fixture
def node():
    return register_node(NODE)


def _report(message: dict) -> str:
    return agent_report.apply(args=[message]).get()


def _holding_job(team, user, *, state=JobState.ASSIGNED, held_for_s=100.0, **fields) -> Job:
    job = make_job(team=team, user=user, state=state, **fields)
    allocate(job, [GPU0])
    assigned_at = timezone.now() - timedelta(seconds=held_for_s)
    Job.objects.filter(pk=job.pk).update(assigned_at=assigned_at)
    job.allocations.update(created_at=assigned_at)
    job.refresh_from_db()
    return job


# --- heartbeats ------------------------------------------------------------------------------


def test_a_first_heartbeat_registers_the_node_its_gpus_and_one_slice_per_allocatable_thing(node):
    assert (node.state, node.driver, node.agent_version) == ("ready", "described", "test-agent")
    assert node.last_heartbeat_at is not None
    gpus = list(Gpu.objects.filter(node=node).order_by("index").values_list("index", "mode"))
    assert gpus == [(0, "whole"), (1, "whole"), (2, "mig"), (3, "mps")]
    slices = sorted(
        Slice.objects.filter(gpu__node=node).values_list("gpu__index", "kind", "profile", "units")
    )
    assert slices == sorted(
        [
            (0, "whole", "", 1.0),
            (1, "whole", "", 1.0),
            (2, "mig", "3g.40gb", 3 / 7),
            (2, "mig", "2g.20gb", 2 / 7),
            (2, "mig", "1g.10gb", 1 / 7),
            (2, "mig", "1g.10gb", 1 / 7),
            *[(3, "mps", "", 0.25)] * 4,
        ]
    )
    mig = Slice.objects.get(profile="3g.40gb")
    assert mig.key == mig.mig_uuid == stable_uuid("MIG", NODE, 2, 0, "3g.40gb")
    assert Slice.objects.filter(kind="mps").order_by("key").first().key == (
        f"{stable_uuid('GPU', NODE, 3)}/mps/0"
    )


def test_slices_that_vanish_are_marked_absent_and_come_back_under_the_same_key(node):
    whole_slice = Slice.objects.get(key=GPU0)
    one_mig_gpu = {"gpus": [{"mode": "mig", "mig": ["7g.80gb"]}]}
    register_node(NODE, description=one_mig_gpu)

    assert not Slice.objects.get(pk=whole_slice.pk).present
    # GPU index 0 is now a MIG GPU: its whole slice is gone, its one MIG instance is new.
    assert list(Slice.objects.filter(present=True).values_list("kind", "profile")) == [
        ("mig", "7g.80gb")
    ]
    assert Gpu.objects.filter(present=True).count() == 1

    register_node(NODE)
    assert Slice.objects.get(pk=whole_slice.pk).present
    assert Slice.objects.filter(present=True).count() == 10


def test_a_lost_node_that_sends_a_heartbeat_is_ready_again(node):
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)
    register_node(NODE)
    assert Node.objects.get(pk=node.pk).state == Node.State.READY


# --- started / log / metrics -----------------------------------------------------------------


def test_started_moves_the_attempt_to_running_once(node, team_and_user):
    job = _holding_job(*team_and_user)
    at = time.time()

    assert _report(started(job.pk, 1, at=at)) == "started"
    assert _report(started(job.pk, 1, at=at + 5)) == "started"

    job.refresh_from_db()
    assert (job.state, job.started_at) == ("RUNNING", datetime.fromtimestamp(at, tz=UTC))
    assert job.events.filter(to_state="RUNNING").count() == 1


def test_a_started_report_of_a_stale_attempt_changes_nothing_and_stops_that_attempt(
    node, team_and_user, django_capture_on_commit_callbacks
):
    job = _holding_job(*team_and_user, attempt=3)

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(started(job.pk, 2))

    job.refresh_from_db()
    assert (job.state, job.attempt) == ("ASSIGNED", 3)
    assert sent.stops() == [
        (
            {
                "type": "stop",
                "v": 1,
                "job_id": job.pk,
                "attempt": 2,
                "reason": "cancel",
                "grace_s": 10.0,
            },
            f"node.{NODE}",
        )
    ]


def test_log_chunks_are_stored_once_per_sequence_number(node, team_and_user):
    job = _holding_job(*team_and_user, state=JobState.RUNNING)

    for seq, text in [(0, "hello\n"), (1, "world\n"), (0, "hello\n")]:
        _report(log_chunk(job.pk, 1, seq, text))
    _report(log_chunk(999_999, 1, 0, "nobody's"))

    assert list(JobLogChunk.objects.values_list("job_id", "attempt", "seq", "data")) == [
        (job.pk, 1, 0, "hello\n"),
        (job.pk, 1, 1, "world\n"),
    ]


def test_metrics_keep_the_latest_sample_of_the_current_attempt(node, team_and_user):
    job = _holding_job(*team_and_user, state=JobState.RUNNING)
    for util, memory in [(10.0, 100), (55.5, 2048)]:
        _report(
            Metrics(
                node=NODE,
                job_id=job.pk,
                attempt=1,
                gpu_util_pct=util,
                memory_used_mb=memory,
                sampled_at=time.time(),
            ).to_dict()
        )

    sample = JobMetrics.objects.get(job=job)
    assert (sample.attempt, sample.gpu_util_pct, sample.memory_used_mb) == (1, 55.5, 2048)


# --- finished --------------------------------------------------------------------------------


def test_finished_succeeded_ends_the_job_frees_its_slices_and_charges_it_once(
    node, team_and_user, django_capture_on_commit_callbacks
):
    team, alice = team_and_user
    job = _holding_job(team, alice, state=JobState.RUNNING, held_for_s=100.0)
    ended = time.time()

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(finished(job.pk, 1, at=ended))
        _report(finished(job.pk, 1, at=ended + 30))

    job.refresh_from_db()
    assert (job.state, job.exit_code, job.reason) == ("SUCCEEDED", 0, "")
    assert job.finished_at == datetime.fromtimestamp(ended, tz=UTC)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    (record,) = UsageRecord.objects.filter(job=job)
    assert (record.attempt, record.gpu_units) == (1, 1.0)
    assert record.unit_seconds == pytest.approx(100.0, abs=0.5)
    team_balance = UsageBalance.objects.get(team=team, user__isnull=True)
    user_balance = UsageBalance.objects.get(team=team, user=alice)
    assert team_balance.unit_seconds == pytest.approx(100.0, abs=0.5)
    assert user_balance.unit_seconds == team_balance.unit_seconds
    assert job.events.filter(to_state="SUCCEEDED").count() == 1
    # The slices are free: a scheduling pass is asked for (once per applied report).
    assert [name for name, _, _ in sent.sent] == ["portal.schedule_pass"]


def test_a_finished_report_that_overtakes_started_still_records_the_start(
    node, team_and_user, django_capture_on_commit_callbacks
):
    job = _holding_job(*team_and_user, state=JobState.ASSIGNED)
    began = time.time() - 2

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(finished(job.pk, 1, at=began + 1, started_at=began))
        _report(started(job.pk, 1, at=began))  # arrives late: applied already, nothing to stop

    job.refresh_from_db()
    assert (job.state, job.started_at) == ("SUCCEEDED", datetime.fromtimestamp(began, tz=UTC))
    assert [(e.from_state, e.to_state) for e in job.events.exclude(from_state="")] == [
        ("ASSIGNED", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    assert sent.stops() == []


@pytest.mark.parametrize(
    ("outcome", "error", "state", "reason"),
    [
        ("failed", "exit code 3", "FAILED", "exit code 3"),
        ("launch_error", "image not found", "FAILED", "image not found"),
        ("timed_out", "", "TIMED_OUT", "timed_out"),
        ("cancelled", "", "CANCELLED", "cancelled"),
    ],
)
def test_finished_outcomes_map_to_end_states(node, team_and_user, outcome, error, state, reason):
    job = _holding_job(*team_and_user, state=JobState.RUNNING)

    _report(finished(job.pk, 1, outcome=outcome, exit_code=None, error=error))

    job.refresh_from_db()
    assert (job.state, job.reason) == (state, reason)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_preempted_job_is_requeued_keeping_its_place_and_attempt(node, team_and_user):
    job = _holding_job(
        *team_and_user,
        state=JobState.RUNNING,
        stop_requested_at=timezone.now(),
        stop_reason="preempt",
        borrowed=True,
    )
    queued_since = job.queued_since

    _report(finished(job.pk, 1, outcome="preempted", exit_code=None))

    job.refresh_from_db()
    assert (job.state, job.attempt, job.queued_since) == ("PENDING", 1, queued_since)
    assert (job.stop_requested_at, job.stop_reason, job.borrowed) == (None, "", False)
    assert list(job.events.values_list("to_state", flat=True))[-2:] == ["PREEMPTED", "PENDING"]
    assert UsageRecord.objects.filter(job=job, attempt=1).count() == 1


def test_a_cancel_that_overtook_a_preemption_ends_the_job_instead_of_requeueing_it(
    node, team_and_user
):
    job = _holding_job(
        *team_and_user,
        state=JobState.RUNNING,
        stop_requested_at=timezone.now(),
        stop_reason="cancel",
    )

    _report(finished(job.pk, 1, outcome="preempted", exit_code=None))

    job.refresh_from_db()
    assert job.state == "CANCELLED"


def test_a_finished_report_of_a_stale_attempt_is_ignored(node, team_and_user):
    job = _holding_job(*team_and_user, state=JobState.RUNNING, attempt=2)

    _report(finished(job.pk, 1, outcome="failed", exit_code=1))

    job.refresh_from_db()
    assert (job.state, job.attempt) == ("RUNNING", 2)
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize(
    "message",
    [
        {"type": "finished", "v": 1, "node": NODE, "job_id": 1, "attempt": 1},
        {"type": "exploded", "v": 1},
        {"type": "started", "v": 99, "node": NODE, "job_id": 1, "attempt": 1, "started_at": 1.0},
        "not a message",
    ],
)
def test_a_bad_report_is_logged_and_dropped_without_retry(node, team_and_user, message, caplog):
    job = _holding_job(*team_and_user, state=JobState.RUNNING)

    assert _report(message) == "dropped"

    assert "dropped a bad" in caplog.text
    job.refresh_from_db()
    assert job.state == "RUNNING"


# --- reconciliation --------------------------------------------------------------------------


def test_a_running_job_its_agent_no_longer_lists_is_lost_and_requeued(node, team_and_user):
    job = _holding_job(*team_and_user, state=JobState.RUNNING, held_for_s=300.0)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=290))

    _report(heartbeat(NODE, running=[]))

    job.refresh_from_db()
    assert (job.state, job.attempt) == ("PENDING", 1)
    assert list(job.events.values_list("to_state", flat=True))[-2:] == ["LOST", "PENDING"]
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert UsageRecord.objects.filter(job=job, attempt=1).count() == 1


def test_reconciliation_leaves_listed_and_just_started_jobs_alone(node, team_and_user):
    team, alice = team_and_user
    listed = _holding_job(team, alice, state=JobState.RUNNING, held_for_s=300.0)
    Job.objects.filter(pk=listed.pk).update(started_at=timezone.now() - timedelta(seconds=290))
    fresh = make_job(team=team, user=alice, state=JobState.RUNNING, started_at=timezone.now())
    allocate(fresh, [stable_uuid("GPU", NODE, 1)])

    _report(heartbeat(NODE, running=[(listed.pk, 1)]))

    assert Job.objects.get(pk=listed.pk).state == "RUNNING"
    assert Job.objects.get(pk=fresh.pk).state == "RUNNING"


def test_an_attempt_the_agent_runs_but_the_portal_does_not_give_it_is_stopped(
    node, team_and_user, django_capture_on_commit_callbacks
):
    team, alice = team_and_user
    requeued = make_job(team=team, user=alice, attempt=1)  # PENDING after a loss

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(heartbeat(NODE, running=[(requeued.pk, 1)]))

    assert [(m["job_id"], m["attempt"], m["reason"], q) for m, q in sent.stops()] == [
        (requeued.pk, 1, "cancel", f"node.{NODE}")
    ]
    assert Job.objects.get(pk=requeued.pk).state == "PENDING"
