"""A scheduling pass end to end, in process: a node registered by its heartbeat, jobs of
every slice kind, one pass, then the rows it wrote and the launch messages it sent."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from portal.agents.testing import capture_sent_messages, register_node
from portal.cluster.models import Slice
from portal.jobs.attempts import attempt_release_and_charge
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.jobs.testing import make_job, make_team, make_user
from portal.scheduling import apply, lock, service, tasks
from portal.scheduling.models import PassRequests, SchedulerState
from portal.scheduling.service import run_schedule_pass
from portal.scheduling.tasks import schedule_pass
from scheduler import ALL_CACHES, Carry
from workers.inventory import stable_uuid

pytestmark = pytest.mark.django_db

NODE = "node-1"
GPU_MEMORY_MB = 81920  # the described inventory's default A100 80GB


@pytest.fixture
def vision():
    team = make_team("vision", guaranteed_units=2.0, limit_units=None)
    return team, make_user("alice", team=team)


def _run_pass(capture_callbacks, **kwargs):
    with capture_sent_messages() as sent, capture_callbacks(execute=True):
        result = run_schedule_pass(**kwargs)
    return result, sent


def _held_slices(job: Job) -> list[Slice]:
    return [
        a.slice
        for a in Allocation.objects.filter(job=job, attempt=job.attempt, released_at__isnull=True)
        .select_related("slice__gpu")
        .order_by("slice__key")
    ]


def _expected_launch(job: Job, devices: list[dict]) -> dict:
    return {
        "type": "launch",
        "v": 2,
        "node": NODE,
        "job_id": job.pk,
        "attempt": 1,
        "name": job.name,
        "team": "vision",
        "user": "alice",
        "image": "python:3.11-slim",
        "command": ["python", "-c", "print('hi')"],
        "env": {"SEED": "7"},
        "devices": devices,
        "time_limit_s": 600.0,
        # One whole GPU's worth of the operator's defaults; no network, any image.
        "policy": {
            "memory_mb": 16384,
            "cpus": 4.0,
            "pids_limit": 4096,
            "network": "none",
            "read_only_rootfs": False,
            "image_prefixes": [],
        },
    }


def test_a_pass_assigns_each_slice_kind_and_sends_exact_launch_messages(
    vision, django_capture_on_commit_callbacks
):
    team, alice = vision
    register_node(NODE)
    common = {"team": team, "user": alice, "env": {"SEED": "7"}, "time_limit_s": 600}
    whole = make_job(name="whole", gpu_kind="whole", **common)
    mig = make_job(name="mig", gpu_kind="mig", gpu_profile="3g.40gb", **common)
    mps = make_job(name="mps", gpu_kind="mps", gpu_count=2, **common)

    result, sent = _run_pass(django_capture_on_commit_callbacks)

    assert result.status == "ran"
    assert sorted(result.assigned) == sorted([whole.pk, mig.pk, mps.pk])
    for job in (whole, mig, mps):
        job.refresh_from_db()
        assert (job.state, job.attempt, job.node.name) == (JobState.ASSIGNED, 1, NODE)
        assert job.pending_code == "" and job.queue_position is None
        event = JobEvent.objects.filter(job=job).last()
        assert (event.from_state, event.to_state, event.attempt) == ("PENDING", "ASSIGNED", 1)

    whole_slice = _held_slices(whole)
    assert [s.kind for s in whole_slice] == ["whole"]
    gpu = whole_slice[0].gpu
    assert whole_slice[0].key == gpu.uuid and gpu.index in (0, 1)

    mig_uuid = stable_uuid("MIG", NODE, 2, 0, "3g.40gb")
    assert [s.key for s in _held_slices(mig)] == [mig_uuid]

    mps_gpu = stable_uuid("GPU", NODE, 3)
    mps_slices = _held_slices(mps)
    assert len(mps_slices) == 2
    assert all(s.key.startswith(f"{mps_gpu}/mps/") for s in mps_slices)

    launches = {message["job_id"]: (message, queue) for message, queue in sent.launches()}
    assert len(sent.launches()) == 3
    assert launches[whole.pk] == (
        _expected_launch(
            whole,
            [
                {
                    "slice_id": gpu.uuid,
                    "kind": "whole",
                    "gpu_uuid": gpu.uuid,
                    "gpu_index": gpu.index,
                    "mig_uuid": "",
                    "profile": "",
                    "mps_fraction": None,
                    "memory_mb": GPU_MEMORY_MB,
                }
            ],
        ),
        f"node.{NODE}",
    )
    assert launches[mig.pk][0]["devices"] == [
        {
            "slice_id": mig_uuid,
            "kind": "mig",
            "gpu_uuid": stable_uuid("GPU", NODE, 2),
            "gpu_index": 2,
            "mig_uuid": mig_uuid,
            "profile": "3g.40gb",
            "mps_fraction": None,
            "memory_mb": 40 * 1024,
        }
    ]
    assert launches[mps.pk][0]["devices"] == [
        {
            "slice_id": s.key,
            "kind": "mps",
            "gpu_uuid": mps_gpu,
            "gpu_index": 3,
            "mig_uuid": "",
            "profile": "",
            "mps_fraction": 0.25,
            "memory_mb": GPU_MEMORY_MB // 4,
        }
        for s in mps_slices
    ]


def test_a_job_that_does_not_fit_stays_pending_with_reason_position_and_estimate(
    vision, django_capture_on_commit_callbacks
):
    team, alice = vision
    register_node(NODE)
    running = make_job(name="big", team=team, user=alice, gpu_count=2, time_limit_s=3600)
    waiting = make_job(name="waits", team=team, user=alice, gpu_count=2, time_limit_s=60)

    result, sent = _run_pass(django_capture_on_commit_callbacks)

    assert result.assigned == (running.pk,)
    waiting.refresh_from_db()
    assert waiting.state == JobState.PENDING
    assert waiting.pending_code in {"NO_FIT", "RESERVED", "WAITING_FOR_RESERVATION"}
    assert waiting.pending_message
    assert waiting.queue_position == 1
    assert waiting.estimated_start_at is not None
    assert waiting.estimated_start_at >= timezone.now() + timedelta(seconds=3000)
    # Its band: "big" may run its whole hour, and nothing finished tells otherwise.
    assert waiting.estimated_start_earliest_at == waiting.estimated_start_at
    assert waiting.estimated_start_latest_at == waiting.estimated_start_at
    assert [m["job_id"] for m, _ in sent.launches()] == [running.pk]


def test_a_slice_freed_while_the_pass_loads_is_booked_after_its_release(
    vision, django_capture_on_commit_callbacks, monkeypatch
):
    """The pass reads the clock before its snapshot; a job's release that commits in between
    frees slices the snapshot then sees free. The next job's allocations are dated when the
    pass writes them, never before that release (the chaos run found one dated 0.1 s before
    the release of the slice it took, which read as a double booking)."""
    team, alice = vision
    register_node(NODE)
    first = make_job(name="first", team=team, user=alice, gpu_count=2, time_limit_s=600)
    _run_pass(django_capture_on_commit_callbacks)
    first.refresh_from_db()
    second = make_job(name="second", team=team, user=alice, gpu_count=2, time_limit_s=600)
    real_load = service.load_snapshot

    def release_then_load(**kwargs):
        # What a finished report committing just after the pass read its clock does.
        Job.objects.filter(pk=first.pk).update(state=JobState.SUCCEEDED)
        ended = timezone.now()
        attempt_release_and_charge(
            job_id=first.pk, attempt=first.attempt, ended_at=ended, now=ended
        )
        return real_load(**kwargs)

    monkeypatch.setattr(service, "load_snapshot", release_then_load)
    result, _ = _run_pass(django_capture_on_commit_callbacks)

    assert result.assigned == (second.pk,)
    released = [a.released_at for a in Allocation.objects.filter(job=first)]
    booked = [a.created_at for a in Allocation.objects.filter(job=second)]
    assert len(released) == len(booked) == 2 and None not in released
    assert min(booked) >= max(released)


def test_finished_jobs_of_the_same_shape_shorten_the_estimated_start(
    vision, django_capture_on_commit_callbacks
):
    # "big" may run an hour, but jobs of its shape ran 10 minutes: the likely start is then,
    # the latest still at its time limit.
    team, alice = vision
    register_node(NODE)
    now = timezone.now()
    for i in range(3):
        make_job(
            name=f"done{i}",
            team=team,
            user=alice,
            gpu_count=2,
            time_limit_s=3600,
            state=JobState.SUCCEEDED,
            started_at=now - timedelta(hours=2),
            finished_at=now - timedelta(hours=2) + timedelta(minutes=10),
        )
    make_job(name="big", team=team, user=alice, gpu_count=2, time_limit_s=3600)
    waiting = make_job(name="waits", team=team, user=alice, gpu_count=2, time_limit_s=60)

    _run_pass(django_capture_on_commit_callbacks)

    waiting.refresh_from_db()
    assert waiting.state == JobState.PENDING
    likely = waiting.estimated_start_at - timezone.now()
    latest = waiting.estimated_start_latest_at - timezone.now()
    assert timedelta(minutes=9) <= likely <= timedelta(minutes=10, seconds=5)
    assert timedelta(minutes=59) <= latest <= timedelta(hours=1, seconds=5)


def test_a_pass_takes_what_the_last_one_learnt_of_each_waiting_job(
    vision, django_capture_on_commit_callbacks, monkeypatch
):
    """The process keeps a scheduler.Carry between its passes: the jobs still waiting, their
    rows unchanged, are the same candidates in the next pass, and its decisions are those
    of a pass that starts from nothing."""
    team, alice = vision
    register_node(NODE)
    jobs = [make_job(name=f"pair-{i}", team=team, user=alice, gpu_count=2) for i in range(4)]
    monkeypatch.setattr(service, "_carry", Carry())
    now = timezone.now()
    first, _ = _run_pass(django_capture_on_commit_callbacks, now=now)
    assert (len(first.assigned), first.pending) == (1, 3)
    waiting = [job.pk for job in jobs if job.pk not in first.assigned]
    kept = service._carry.candidates(ALL_CACHES)
    assert kept is not None
    carried = {c.job.id: c for c in kept.values()}
    assert set(carried) >= {str(pk) for pk in waiting}

    second, _ = _run_pass(django_capture_on_commit_callbacks, now=now)
    stored = _explanations()
    again = {c.job.id: c for c in service._carry.candidates(ALL_CACHES).values()}
    assert all(again[str(pk)] is carried[str(pk)] for pk in waiting)  # not nominated again

    monkeypatch.setattr(service, "_carry", Carry())  # a pass that starts from nothing
    fresh, _ = _run_pass(django_capture_on_commit_callbacks, now=now)
    assert (second.assigned, second.pending) == (fresh.assigned, fresh.pending) == ((), 3)
    assert _explanations() == stored


def _explanations() -> list[tuple]:
    """Every job's stored explanation, by pk."""
    return list(Job.objects.order_by("pk").values_list("pk", *apply._EXPLANATION_COLUMNS))


def _explanation(pk: int) -> tuple:
    return Job.objects.values_list(*apply._EXPLANATION_COLUMNS).get(pk=pk)


@pytest.mark.parametrize(
    "change",
    [
        # Something cleared one explanation since (as a hold and release does).
        pytest.param({"pending_code": "", "queue_position": None}, id="cleared"),
        # The numbers alone changed (read as text, decoded when the rest is equal).
        pytest.param({"pending_numbers": {"needs": -1}}, id="numbers"),
    ],
)
def test_a_second_pass_sends_only_the_explanation_that_changed(
    vision, django_capture_on_commit_callbacks, monkeypatch, change
):
    # Compared with the stored ones in the pass, not sent for the database to compare.
    team, alice = vision
    register_node(NODE)
    kept = make_job(name="mig", team=team, user=alice, gpu_kind="mig", gpu_profile="7g.80gb")
    touched = make_job(name="mig-2", team=team, user=alice, gpu_kind="mig", gpu_profile="7g.80gb")
    now = timezone.now()
    _run_pass(django_capture_on_commit_callbacks, now=now)
    explained = _explanation(kept.pk), _explanation(touched.pk)
    assert explained[1][0] != "" and explained[1][2]  # a code, and numbers
    Job.objects.filter(pk=touched.pk).update(**change)
    sent_rows = []
    real_update_rows = apply.update_rows

    def recording(model, columns, rows, **kwargs):
        if model is Job and "pending_code" in columns:
            sent_rows.extend(row[0] for row in rows)
        return real_update_rows(model, columns, rows, **kwargs)

    monkeypatch.setattr(apply, "update_rows", recording)
    second, _ = _run_pass(django_capture_on_commit_callbacks, now=now)

    assert sent_rows == [touched.pk]
    assert second.explanations_written == 1
    assert (_explanation(kept.pk), _explanation(touched.pk)) == explained


def test_a_second_pass_writes_no_explanation_that_did_not_change(
    vision, django_capture_on_commit_callbacks
):
    team, alice = vision
    register_node(NODE)
    make_job(name="mig", team=team, user=alice, gpu_kind="mig", gpu_profile="7g.80gb")
    now = timezone.now()

    first, _ = _run_pass(django_capture_on_commit_callbacks, now=now)
    second, sent = _run_pass(django_capture_on_commit_callbacks, now=now)

    assert first.explanations_written == 1
    assert (second.pending, second.explanations_written) == (1, 0)
    assert sent.launches() == []


def test_a_pass_records_itself_for_coalescing_and_operators(
    vision, django_capture_on_commit_callbacks
):
    team, alice = vision
    register_node(NODE)
    make_job(team=team, user=alice)
    now = timezone.now()

    _run_pass(django_capture_on_commit_callbacks, now=now)

    state = SchedulerState.objects.get(pk=1)
    assert (state.snapshot_at, state.passes, state.assigned) == (now, 1, 1)


@contextmanager
def _lock_held_elsewhere(settings):
    """The scheduler lock held by someone else for the block, as a running pass holds it."""
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        with lock.scheduler_file_lock() as got:
            assert got
            yield
        return
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            assert lock.try_advisory_lock()
            holding.set()
            release.wait(10)
        connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        release.set()
        thread.join()


def test_a_pass_is_skipped_while_another_holds_the_lock(settings, vision):
    with _lock_held_elsewhere(settings):
        assert run_schedule_pass().status == "skipped"


def test_a_request_that_finds_a_pass_running_counts_itself_and_leaves_it_to_that_pass(
    settings, vision
):
    before = service.pass_requests()
    with _lock_held_elsewhere(settings), capture_sent_messages() as sent:
        requested_at = timezone.now().timestamp()
        assert schedule_pass.apply(kwargs={"requested_at": requested_at}).get() == "deferred"

    assert service.pass_requests() == before + 1
    assert not SchedulerState.objects.filter(pk=1, passes__gt=0).exists()  # no pass ran
    assert sent.sent == []  # no retry of its own


def test_a_pass_runs_once_more_for_the_requests_counted_while_it_ran(
    vision, django_capture_on_commit_callbacks, monkeypatch
):
    team, alice = vision
    register_node(NODE)
    # A request counts itself while the beat's pass holds the lock (after its snapshot):
    # a job submitted then is not in that pass.
    job: list[Job] = []
    real_load = service.load_snapshot

    def load_then_a_request_comes(**kwargs):
        loaded = real_load(**kwargs)
        if not job:
            job.append(make_job(team=team, user=alice))
            service.count_pass_request()
        return loaded

    monkeypatch.setattr(service, "load_snapshot", load_then_a_request_comes)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert schedule_pass.apply().get() == "ran"

    assert SchedulerState.objects.get(pk=1).passes == 2  # the follow-up, and no third
    job[0].refresh_from_db()
    assert job[0].state == JobState.ASSIGNED
    assert [message["job_id"] for message, _ in sent.launches()] == [job[0].pk]


def test_a_follow_up_pass_waits_the_last_pass_s_duration_times_the_gap_with_passes_paced(
    vision, settings, django_capture_on_commit_callbacks, monkeypatch
):
    settings.SCHEDULE_FOLLOW_UP_GAP = 0.5
    real_run, durations, waits = service.run_schedule_pass, [], []

    def timed_run(**kwargs):
        result = real_run(**kwargs)
        durations.append(result.total_ms)
        return result

    def wait(seconds):
        # Meanwhile the passes are paced: a request is counted and left to this task.
        waits.append(seconds)
        if len(waits) == 1:
            requested_at = timezone.now().timestamp()
            assert schedule_pass.apply(kwargs={"requested_at": requested_at}).get() == "deferred"

    monkeypatch.setattr(tasks, "run_schedule_pass", timed_run)
    monkeypatch.setattr(tasks, "sleep", wait)
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        assert schedule_pass.apply().get() == "ran"

    assert len(durations) == 2  # the pass, and one follow-up for the request
    assert waits == [
        pytest.approx(0.5 * durations[0] / 1000),
        pytest.approx(0.5 * durations[1] / 1000),
    ]
    assert PassRequests.objects.get(pk=1).paced_until is None  # no longer paced


def test_a_request_runs_its_pass_when_a_pacing_is_long_past_its_end(
    vision, django_capture_on_commit_callbacks
):
    # The task that paced the passes died waiting: its requests are not left to it forever.
    service.pace_passes(timezone.now() - tasks.PACING_SLACK - timedelta(seconds=1))
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        requested_at = timezone.now().timestamp()
        assert schedule_pass.apply(kwargs={"requested_at": requested_at}).get() == "ran"


def test_with_no_gap_a_follow_up_starts_at_once(
    vision, settings, django_capture_on_commit_callbacks, monkeypatch
):
    settings.SCHEDULE_FOLLOW_UP_GAP = 0.0
    real_load, waits = service.load_snapshot, []
    requests = iter([True])

    def load_then_a_request_comes(**kwargs):
        if next(requests, False):
            service.count_pass_request()
        return real_load(**kwargs)

    monkeypatch.setattr(service, "load_snapshot", load_then_a_request_comes)
    monkeypatch.setattr(tasks, "sleep", waits.append)
    with capture_sent_messages(), django_capture_on_commit_callbacks(execute=True):
        assert schedule_pass.apply().get() == "ran"

    assert SchedulerState.objects.get(pk=1).passes == 2
    assert waits == []


def test_a_task_hands_on_after_five_follow_ups(
    vision, django_capture_on_commit_callbacks, monkeypatch
):
    real_load = service.load_snapshot

    def load_then_a_request_comes(**kwargs):
        service.count_pass_request()  # every pass finds a new request when it ends
        return real_load(**kwargs)

    monkeypatch.setattr(service, "load_snapshot", load_then_a_request_comes)
    monkeypatch.setattr(tasks, "sleep", lambda seconds: None)
    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        assert schedule_pass.apply().get() == "ran"

    assert SchedulerState.objects.get(pk=1).passes == 1 + tasks.FOLLOW_UPS_PER_TASK
    assert [name for name, _, _ in sent.sent] == ["portal.schedule_pass"]


def test_the_task_skips_a_request_that_a_later_pass_already_covered(
    vision, django_capture_on_commit_callbacks
):
    register_node(NODE)
    requested_at = timezone.now()
    _run_pass(django_capture_on_commit_callbacks, now=requested_at + timedelta(seconds=1))

    assert schedule_pass.apply(kwargs={"requested_at": requested_at.timestamp()}).get() == (
        "covered"
    )
    later = requested_at + timedelta(seconds=5)
    with capture_sent_messages():
        assert schedule_pass.apply(kwargs={"requested_at": later.timestamp()}).get() == "ran"
