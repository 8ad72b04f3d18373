"""What the control plane does with each agent report: registration and inventory,
started / log / finished / metrics, repeats, stale attempts, bad messages, and what a
heartbeat settles (a late `started` or `finished`) or asks about (never a loss by itself)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.accounting.models import UsageBalance, UsageRecord
from portal.agents.keys import node_keys
from portal.agents.models import Dispatch, JobMetrics, RefusedMessage
from portal.agents.tasks import agent_report
from portal.agents.testing import (
    capture_sent_messages,
    deliver,
    finished,
    heartbeat,
    log_chunk,
    register_node,
    started,
)
from portal.cluster.models import Gpu, Node, Slice
from portal.jobs.attempts import attempt_lose
from portal.jobs.models import Allocation, Job, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_team, make_user
from workers.inventory import stable_uuid
from workers.protocol import Metrics, RunningAttempt
from workers.signing import sign_text

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
    """What the message does when its node's agent sends it (signed with the node's key)."""
    return deliver(message)


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
    # Attempt 2 ran on this node before (its slices long released).
    Allocation.objects.create(
        job=job,
        attempt=2,
        slice=Slice.objects.get(key=GPU0),
        created_at=timezone.now(),
        released_at=timezone.now(),
    )

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(started(job.pk, 2))

    job.refresh_from_db()
    assert (job.state, job.attempt) == ("ASSIGNED", 3)
    assert sent.stops() == [
        (
            {
                "type": "stop",
                "v": 2,
                "node": NODE,
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
    # The slices are free: a scheduling pass is asked for (once per applied report), and
    # both reports, the repeat too, are acknowledged.
    assert [name for name, _, _ in sent.sent] == ["portal.schedule_pass", "agent.ack", "agent.ack"]


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


def _sealed_as_is(message: object, *, node: str = NODE) -> dict[str, str]:
    """An envelope signed with the node's real key around a message that is not checked
    first (``signed()`` refuses to seal an invalid one): what a buggy agent could send."""
    text = json.dumps(
        {"node": node, "ts": time.time(), "nonce": uuid.uuid4().hex, "msg": message},
        separators=(",", ":"),
    )
    return {"signed": text, "sig": sign_text(node_keys([node])[node], text)}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"type": "finished", "v": 2, "node": NODE, "job_id": 1, "attempt": 1}, "invalid"),
        ({"type": "exploded", "v": 2}, "wrong_direction"),
        (
            {"type": "started", "v": 1, "node": NODE, "job_id": 1, "attempt": 1, "started_at": 1.0},
            "invalid",
        ),
        ("not a message", "wrong_direction"),
    ],
)
def test_a_bad_report_is_refused_recorded_and_not_retried(
    node, team_and_user, message, reason, caplog
):
    job = _holding_job(*team_and_user, state=JobState.RUNNING)
    events = job.events.count()

    assert agent_report(_sealed_as_is(message)) == f"refused: {reason}"

    assert "refused a" in caplog.text
    assert RefusedMessage.objects.filter(node=NODE, reason=reason).count() == 1
    job.refresh_from_db()
    assert (job.state, job.events.count()) == ("RUNNING", events)


# --- acknowledgements --------------------------------------------------------------------------


def _key(kind: str, job_id: int, attempt: int, seq: int = 0) -> dict:
    return {"kind": kind, "job_id": job_id, "attempt": attempt, "seq": seq}


def test_each_report_is_acknowledged_with_its_key_once_it_committed(
    node, team_and_user, django_capture_on_commit_callbacks
):
    job = _holding_job(*team_and_user, state=JobState.ASSIGNED)

    with capture_sent_messages() as sent:
        with django_capture_on_commit_callbacks() as callbacks:
            _report(started(job.pk, 1))
            _report(log_chunk(job.pk, 1, 0, "hello\n"))
            _report(finished(job.pk, 1))
        # Nothing goes out before the transaction that applied the reports committed.
        assert sent.acks() == []
        for callback in callbacks:
            callback()

    assert Job.objects.get(pk=job.pk).state == "SUCCEEDED"
    assert sent.acks() == [
        (
            {
                "type": "ack",
                "v": 2,
                "node": NODE,
                "boot": "",
                "heartbeat_seq": None,
                "lease_s": None,
                "reports": [key],
            },
            f"node.{NODE}",
        )
        for key in (
            _key("started", job.pk, 1),
            _key("log", job.pk, 1, 0),
            _key("finished", job.pk, 1),
        )
    ]


def test_a_repeated_or_stale_report_is_acknowledged_all_the_same(
    node, team_and_user, django_capture_on_commit_callbacks
):
    """The agent must be able to forget a report the portal has no use for, or its outbox
    would resend it forever."""
    team, alice = team_and_user
    done = _holding_job(team, alice, state=JobState.RUNNING)
    moved_on = make_job(team=team, user=alice, state=JobState.RUNNING, attempt=2)
    allocate(moved_on, [stable_uuid("GPU", NODE, 1)])
    _report(finished(done.pk, 1))
    events = {job.pk: job.events.count() for job in (done, moved_on)}

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(finished(done.pk, 1, outcome="failed", exit_code=1))  # a repeat
        _report(finished(moved_on.pk, 1, outcome="failed", exit_code=1))  # a stale attempt
        _report(started(moved_on.pk, 1))

    assert [m["reports"] for m, _ in sent.acks()] == [
        [_key("finished", done.pk, 1)],
        [_key("finished", moved_on.pk, 1)],
        [_key("started", moved_on.pk, 1)],
    ]
    assert Job.objects.get(pk=done.pk).state == "SUCCEEDED"
    assert (Job.objects.get(pk=moved_on.pk).state, moved_on.events.count()) == (
        "RUNNING",
        events[moved_on.pk],
    )
    assert done.events.count() == events[done.pk]


def test_a_heartbeat_is_acknowledged_with_its_run_seq_lease_and_the_reports_it_settled(
    node, team_and_user, settings, django_capture_on_commit_callbacks
):
    settings.AGENT_LEASE_S = 12.0
    job = _holding_job(*team_and_user, state=JobState.RUNNING)
    beat = heartbeat(NODE, finished=[finished(job.pk, 1)])

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert _report(beat) == "heartbeat"

    assert sent.acks() == [
        (
            {
                "type": "ack",
                "v": 2,
                "node": NODE,
                "boot": beat["boot"],
                "heartbeat_seq": beat["seq"],
                "lease_s": 12.0,
                "reports": [_key("finished", job.pk, 1)],
            },
            f"node.{NODE}",
        )
    ]


# --- what a heartbeat settles --------------------------------------------------------------------


def test_a_finished_attempt_in_a_heartbeat_ends_the_job_as_its_report_would(node, team_and_user):
    job = _holding_job(*team_and_user, state=JobState.RUNNING, held_for_s=100.0)
    ended = time.time()

    _report(
        heartbeat(
            NODE,
            finished=[
                finished(job.pk, 1, outcome="failed", exit_code=3, error="exit code 3", at=ended)
            ],
        )
    )

    job.refresh_from_db()
    assert (job.state, job.exit_code, job.reason) == ("FAILED", 3, "exit code 3")
    assert job.finished_at == datetime.fromtimestamp(ended, tz=UTC)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert UsageRecord.objects.filter(job=job, attempt=1).count() == 1
    # The report itself, arriving late, changes nothing more.
    events = job.events.count()
    _report(finished(job.pk, 1, outcome="failed", exit_code=3, error="exit code 3", at=ended))
    assert job.events.count() == events
    assert UsageRecord.objects.filter(job=job).count() == 1


def test_a_running_attempt_with_a_start_time_in_a_heartbeat_moves_assigned_to_running(
    node, team_and_user
):
    job = _holding_job(*team_and_user, state=JobState.ASSIGNED)
    began = time.time() - 3
    listed = RunningAttempt(job_id=job.pk, attempt=1, started_at=began, pid=4242)

    _report(heartbeat(NODE, running=[listed]))

    job.refresh_from_db()
    assert (job.state, job.started_at) == ("RUNNING", datetime.fromtimestamp(began, tz=UTC))
    (event,) = job.events.filter(to_state="RUNNING")
    assert event.message == f"started on {NODE} (from its heartbeat)"
    # Listed without a start time (still starting): left ASSIGNED, nothing asked.
    other = make_job(
        team=job.team,
        user=job.user,
        state=JobState.ASSIGNED,
        assigned_at=timezone.now() - timedelta(seconds=100),
    )
    allocate(other, [stable_uuid("GPU", NODE, 1)])
    _report(heartbeat(NODE, running=[(other.pk, 1)]))
    assert Job.objects.get(pk=other.pk).state == "ASSIGNED"


# --- never lost on one heartbeat ------------------------------------------------------------------


def test_a_running_attempt_a_heartbeat_does_not_mention_stays_running_and_is_asked_about_once(
    node, team_and_user, settings, django_capture_on_commit_callbacks
):
    settings.QUERY_RESEND_S = 10.0
    job = _holding_job(*team_and_user, state=JobState.RUNNING, held_for_s=300.0)
    events = job.events.count()

    def beat() -> list:
        with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
            assert _report(heartbeat(NODE, running=[])) == "heartbeat"
        return sent.queries()

    first, second = beat(), beat()

    job.refresh_from_db()
    assert (job.state, job.attempt, job.events.count()) == ("RUNNING", 1, events)
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 1
    assert first == [
        ({"type": "query", "v": 2, "node": NODE, "job_id": job.pk, "attempt": 1}, f"node.{NODE}")
    ]
    assert second == []  # within PORTAL_QUERY_RESEND_S: asked already
    Dispatch.objects.filter(job=job, kind="query").update(
        last_sent_at=timezone.now() - timedelta(seconds=11)
    )
    assert [m["job_id"] for m, _ in beat()] == [job.pk]
    assert Dispatch.objects.get(job=job, kind="query").sends == 2
    assert Job.objects.get(pk=job.pk).state == "RUNNING"


def test_an_attempt_not_yet_started_is_not_asked_about_by_a_heartbeat(
    node, team_and_user, settings, django_capture_on_commit_callbacks
):
    # Its launch may still be on its way (a backlog, a dropped copy the reaper sends again):
    # a query overtaking it would make the node refuse the attempt for good.
    settings.RECONCILE_GRACE_S = 5.0
    job = _holding_job(*team_and_user, state=JobState.ASSIGNED, held_for_s=60.0)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert _report(heartbeat(NODE, running=[])) == "heartbeat"
    assert sent.queries() == []
    assert Job.objects.get(pk=job.pk).state == "ASSIGNED"


@pytest.mark.parametrize("answer", ["unknown", "fenced", "lost"])
def test_the_nodes_answer_that_an_attempt_is_gone_requeues_it_counting_a_retry(
    node, team_and_user, settings, answer
):
    settings.JOB_MAX_RETRIES = 3
    job = _holding_job(*team_and_user, state=JobState.RUNNING, held_for_s=300.0)
    queued_since = job.queued_since

    _report(finished(job.pk, 1, outcome=answer, exit_code=None, error="no record of it"))

    job.refresh_from_db()
    assert (job.state, job.attempt, job.queued_since) == ("PENDING", 1, queued_since)
    lost, requeued = job.events.order_by("at", "id")[job.events.count() - 2 :]
    assert (lost.from_state, lost.to_state) == ("RUNNING", "LOST")
    assert lost.message == f"lost: {answer} on {NODE}: no record of it"
    assert (requeued.to_state, requeued.message) == (
        "PENDING",
        "requeued after loss 1 of 4 allowed",
    )
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert UsageRecord.objects.filter(job=job, attempt=1).count() == 1


def test_an_unknown_answer_counts_against_the_retries_like_any_loss(node, team_and_user, settings):
    settings.JOB_MAX_RETRIES = 0
    job = _holding_job(*team_and_user, state=JobState.RUNNING, held_for_s=300.0)

    _report(finished(job.pk, 1, outcome="unknown", exit_code=None))

    job.refresh_from_db()
    assert job.state == "FAILED"
    assert job.reason == f"lost 1 times (PORTAL_JOB_MAX_RETRIES=0); last: unknown on {NODE}"


def test_a_job_whose_cancel_was_asked_for_ends_cancelled_when_its_node_answers_fenced(
    node, team_and_user
):
    job = _holding_job(
        *team_and_user,
        state=JobState.RUNNING,
        stop_requested_at=timezone.now(),
        stop_reason="cancel",
    )

    _report(finished(job.pk, 1, outcome="fenced", exit_code=137))

    job.refresh_from_db()
    assert (job.state, job.reason) == ("CANCELLED", "fenced")
    assert job.finished_at is not None
    assert not job.events.filter(to_state__in=["LOST", "PENDING"]).exclude(from_state="").exists()
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


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


# --- a result that outlived its node's lease ---------------------------------------------------


def _lost_and_requeued(team, user) -> Job:
    job = _holding_job(team, user, state=JobState.RUNNING, attempt=1)
    assert attempt_lose(job_id=job.pk, attempt=1, why="lease lapsed") == JobState.PENDING
    job.refresh_from_db()
    return job


def test_a_late_success_of_a_lost_attempt_ends_the_requeued_job_instead_of_running_it_again(
    node, team_and_user
):
    job = _lost_and_requeued(*team_and_user)
    assert (job.state, job.attempt) == (JobState.PENDING, 1)

    assert _report(finished(job.pk, 1, outcome="succeeded", exit_code=0)) == "finished"

    job.refresh_from_db()
    assert (job.state, job.attempt, job.exit_code) == (JobState.SUCCEEDED, 1, 0)
    assert "it is not run again" in job.events.order_by("-id").first().message


def test_a_late_success_stops_the_next_attempt_that_was_assigned_but_not_started(
    node, team_and_user, django_capture_on_commit_callbacks
):
    job = _lost_and_requeued(*team_and_user)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.ASSIGNED, attempt=2, assigned_at=timezone.now()
    )
    job.refresh_from_db()
    allocate(job, [stable_uuid("GPU", NODE, 1)])

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        _report(finished(job.pk, 1, outcome="succeeded", exit_code=0))

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 1)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert [(m["attempt"], m["reason"]) for m, _ in sent.stops()] == [(2, "cancel")]


def test_a_late_result_does_not_undo_a_next_attempt_that_already_started(node, team_and_user):
    job = _lost_and_requeued(*team_and_user)
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, attempt=2, assigned_at=timezone.now(), started_at=timezone.now()
    )

    _report(finished(job.pk, 1, outcome="succeeded", exit_code=0))

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, 2)


def test_a_late_stop_outcome_of_a_lost_attempt_changes_nothing(node, team_and_user):
    job = _lost_and_requeued(*team_and_user)

    _report(finished(job.pk, 1, outcome="fenced", exit_code=143))

    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
