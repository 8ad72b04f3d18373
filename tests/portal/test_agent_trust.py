"""The broker carries messages, not authority: what the portal refuses from it, and what it
signs for the agents.

Every refusal leaves the job as it was (state, attempt, history, slices, log) and a
`RefusedMessage` row with its reason. Messages are delivered to the control plane's report
task as the broker would hand them over, signed or not.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from portal.agents.dispatch import request_stop, send_launch
from portal.agents.keys import node_key_text
from portal.agents.models import NodeCredential, RefusedMessage
from portal.agents.tasks import agent_report
from portal.agents.testing import (
    capture_sent_messages,
    finished,
    heartbeat,
    log_chunk,
    register_node,
    signed,
    started,
)
from portal.cluster.models import Gpu, Node, Slice
from portal.jobs.models import Allocation, Job, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from workers.inventory import stable_uuid
from workers.protocol import TASK_LAUNCH, TASK_STOP, TO_AGENT_TYPES, Device, Launch, Stop, parse
from workers.signing import (
    SignatureError,
    check_fresh,
    key_from_text,
    message_of,
    open_envelope,
    seal,
    verify_signature,
)

pytestmark = pytest.mark.django_db

NODE = "node-1"
OTHER = "node-2"
GPU0 = stable_uuid("GPU", NODE, 0)


def _key(node: str) -> bytes:
    return key_from_text(node_key_text(name=node))


@pytest.fixture
def vision_job() -> Job:
    """A vision job RUNNING on node-1's GPU 0, its node registered with its own key."""
    register_node(NODE)
    team = make_team("vision", limit_units=None)
    alice = make_user("alice", team=team)
    job = make_job(
        team=team, user=alice, state=JobState.RUNNING, assigned_at=timezone.now(), started_at=None
    )
    allocate(job, [GPU0])
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now())
    job.refresh_from_db()
    return job


def _as_it_is(job: Job) -> tuple[Any, ...]:
    """Everything a forged report could change about a job."""
    job.refresh_from_db()
    return (
        job.state,
        job.attempt,
        job.exit_code,
        job.reason,
        job.finished_at,
        list(job.events.values_list("from_state", "to_state", "attempt", "message")),
        list(Allocation.objects.filter(job=job).values_list("slice__key", "released_at")),
        list(JobLogChunk.objects.filter(job=job).values_list("seq", "data")),
    )


def _refused(raw: Any, reason: str, job: Job, *, node: str = NODE) -> RefusedMessage:
    """Deliver ``raw``; it must be refused for ``reason`` with the job unchanged and no
    acknowledgement. Returns the refusal's record."""
    before = _as_it_is(job)
    with capture_sent_messages() as sent:
        assert agent_report(raw) == f"refused: {reason}"
    assert _as_it_is(job) == before
    assert sent.sent == []  # no ack, no stop, no pass
    (record,) = RefusedMessage.objects.filter(reason=reason)
    assert record.node == node
    return record


# --- refused reports ----------------------------------------------------------------------------


def test_it_refuses_a_report_signed_with_another_key_for_the_right_node(vision_job):
    forged = seal(
        parse(finished(vision_job.pk, 1, outcome="failed", exit_code=1)),
        node=NODE,
        key=secrets.token_bytes(32),
        now=time.time(),
    )

    record = _refused(forged, "bad_signature", vision_job)

    assert record.kind == "finished"
    assert record.detail == f"signature does not match {NODE}'s key"


def test_it_refuses_a_report_naming_another_node_inside_a_valid_nodes_envelope(vision_job):
    register_node(OTHER)
    # node-2's agent (its key is genuine) claims to speak for node-1.
    claim = seal(
        parse(finished(vision_job.pk, 1, outcome="failed", exit_code=1, node=NODE)),
        node=OTHER,
        key=_key(OTHER),
        now=time.time(),
    )

    record = _refused(claim, "wrong_node", vision_job, node=OTHER)

    assert record.detail == f"the message names node {NODE!r} but is signed for {OTHER!r}"


def test_it_refuses_a_replay_of_a_report_it_applied(vision_job):
    envelope = signed(log_chunk(vision_job.pk, 1, 0, "hello\n"))
    assert agent_report(envelope) == "log"
    assert JobLogChunk.objects.filter(job=vision_job).count() == 1

    record = _refused(envelope, "replay", vision_job)

    assert record.kind == "log"


@pytest.mark.parametrize("skew_s", [-301.0, 301.0])
def test_it_refuses_a_report_whose_timestamp_is_outside_the_allowed_skew(
    vision_job, settings, skew_s
):
    settings.MESSAGE_MAX_SKEW_S = 300.0
    old = signed(finished(vision_job.pk, 1), at=time.time() + skew_s)

    record = _refused(old, "stale", vision_job)

    assert record.detail.endswith("at most 300 s allowed")


def test_it_refuses_a_report_from_a_node_without_a_key(vision_job):
    stranger = seal(
        parse(finished(vision_job.pk, 1, node="node-9")),
        node="node-9",
        key=secrets.token_bytes(32),
        now=time.time(),
    )

    record = _refused(stranger, "unknown_node", vision_job, node="node-9")

    assert record.detail == "node 'node-9' has no key (run `manage.py node_add node-9`)"
    assert not Node.objects.filter(name="node-9").exists()


def test_it_refuses_a_message_agents_never_send(vision_job):
    device = Device(slice_id=GPU0, kind="whole", gpu_uuid=GPU0, gpu_index=0)
    launch = Launch(
        node=NODE,
        job_id=vision_job.pk,
        attempt=1,
        name="x",
        team="vision",
        user="alice",
        image="python:3.11-slim",
        command=("true",),
        env={},
        devices=(device,),
    )

    record = _refused(
        seal(launch, node=NODE, key=_key(NODE), now=time.time()), "wrong_direction", vision_job
    )

    assert (record.kind, record.detail) == ("launch", "a 'launch' message is not accepted here")


def test_it_refuses_an_unsigned_report(vision_job):
    record = _refused(
        finished(vision_job.pk, 1, outcome="failed", exit_code=1), "malformed", vision_job, node=""
    )

    assert record.kind == "finished"


def test_a_member_of_one_team_cannot_finish_or_write_into_another_teams_job_from_inside_a_job(
    vision_job,
):
    """A job of `nlp` can reach the broker (the worst case) but holds no node key: whatever it
    sends for a `vision` job, bare or with a key it made up, is refused."""
    nlp = make_team("nlp", limit_units=None)
    bob = make_user("bob", team=nlp)
    theirs = make_job(team=nlp, user=bob, state=JobState.RUNNING, assigned_at=timezone.now())
    allocate(theirs, [stable_uuid("GPU", NODE, 1)])
    guessed = secrets.token_bytes(32)
    attempts = [
        finished(vision_job.pk, 1, outcome="failed", exit_code=1, error="sabotage"),
        log_chunk(vision_job.pk, 1, 0, "written by nlp\n"),
        started(vision_job.pk, 1),
    ]
    before = _as_it_is(vision_job)

    with capture_sent_messages() as sent:
        verdicts = [agent_report(message) for message in attempts]
        verdicts += [
            agent_report(seal(parse(m), node=NODE, key=guessed, now=time.time())) for m in attempts
        ]

    assert verdicts == ["refused: malformed"] * 3 + ["refused: bad_signature"] * 3
    assert _as_it_is(vision_job) == before
    assert sent.sent == []
    assert RefusedMessage.objects.count() == 6


def test_a_node_cannot_report_on_an_attempt_that_was_never_placed_on_it(
    vision_job, django_capture_on_commit_callbacks
):
    """Even with a valid key of its own, node-2 cannot end or write into node-1's job: the
    report is not applied, recorded, and acknowledged so the agent's outbox drains."""
    register_node(OTHER)
    before = _as_it_is(vision_job)

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        verdicts = [
            agent_report(signed(finished(vision_job.pk, 1, node=OTHER, outcome="failed"))),
            agent_report(signed(log_chunk(vision_job.pk, 1, 0, "not mine\n", node=OTHER))),
        ]

    assert verdicts == ["finished", "log"]
    assert _as_it_is(vision_job) == before
    assert RefusedMessage.objects.filter(reason="not_its_attempt", node=OTHER).count() == 2
    assert [ack["node"] for ack, _ in sent.acks()] == [OTHER, OTHER]


# --- what a node may claim -------------------------------------------------------------------------


def test_a_node_listing_another_nodes_gpu_does_not_get_it_and_gets_its_own(vision_job):
    stolen = heartbeat(OTHER)
    stolen["inventory"]["gpus"][0]["uuid"] = GPU0  # node-1's GPU, which runs vision_job
    before = _as_it_is(vision_job)

    assert agent_report(signed(stolen)) == "heartbeat"

    gpu = Gpu.objects.get(uuid=GPU0)
    assert (gpu.node.name, gpu.index, gpu.present) == (NODE, 0, True)
    assert Slice.objects.get(key=GPU0).gpu.node.name == NODE
    assert _as_it_is(vision_job) == before
    assert sorted(Gpu.objects.filter(node__name=OTHER).values_list("index", "uuid")) == [
        (i, stable_uuid("GPU", OTHER, i)) for i in (1, 2, 3)
    ]
    (record,) = RefusedMessage.objects.filter(reason="gpu_claimed")
    assert record.node == OTHER
    assert record.detail == (
        f"{OTHER} listed GPU {GPU0}, which belongs to node {NODE}: not given to it"
    )


def test_a_second_agent_run_for_a_live_node_is_refused_and_renews_nothing(vision_job, settings):
    settings.AGENT_LEASE_S = 30.0
    node = Node.objects.get(name=NODE)
    last = timezone.now() - timedelta(seconds=10)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=last)
    current = NodeCredential.objects.get(node=node).boot
    slices = list(Slice.objects.filter(gpu__node=node, present=True).values_list("key"))
    # The intruder lists nothing running and only one GPU: nothing of that may be applied.
    intruder = heartbeat(NODE, boot="intruder-run", description={"gpus": [{"mode": "whole"}]})

    record = _refused(signed(intruder), "duplicate_agent", vision_job)

    assert record.kind == "heartbeat"
    assert f"whose agent run {current} is alive" in record.detail
    node.refresh_from_db()
    assert node.last_heartbeat_at == last
    assert NodeCredential.objects.get(node=node).boot == current
    assert list(Slice.objects.filter(gpu__node=node, present=True).values_list("key")) == slices


def test_a_restarted_agent_naming_the_current_run_takes_over_at_once(vision_job):
    node = Node.objects.get(name=NODE)
    current = NodeCredential.objects.get(node=node).boot

    assert agent_report(signed(heartbeat(NODE, boot="run-2", previous_boot=current))) == (
        "heartbeat"
    )

    assert NodeCredential.objects.get(node=node).boot == "run-2"
    # The old run is the stranger now.
    assert agent_report(signed(heartbeat(NODE, boot=current))) == "refused: duplicate_agent"


def test_a_new_agent_run_takes_over_once_the_lease_lapsed(vision_job, settings):
    settings.AGENT_LEASE_S = 30.0
    node = Node.objects.get(name=NODE)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=31))

    beat = heartbeat(NODE, boot="after-reboot", running=[(vision_job.pk, 1)])
    assert agent_report(signed(beat)) == "heartbeat"

    credential = NodeCredential.objects.get(node=node)
    assert credential.boot == "after-reboot"
    node.refresh_from_db()
    assert (timezone.now() - node.last_heartbeat_at).total_seconds() < 5
    assert Job.objects.get(pk=vision_job.pk).state == "RUNNING"


# --- what the portal signs -----------------------------------------------------------------------


def _opened(raw: Any, *, key: bytes) -> Any:
    """What the node's agent does with a message from its queue."""
    envelope = open_envelope(raw)
    verify_signature(envelope, key)
    check_fresh(envelope, now=time.time(), max_skew_s=300.0)
    return message_of(envelope, allowed_types=TO_AGENT_TYPES)


def test_the_portal_signs_launches_and_stops_with_the_nodes_own_key():
    register_node(NODE)
    register_node(OTHER)
    team = make_team("vision", limit_units=None)
    job = make_job(
        team=team,
        user=make_user("alice", team=team),
        state=JobState.ASSIGNED,
        assigned_at=timezone.now(),
    )
    allocate(job, [GPU0])

    with capture_sent_messages() as sent:
        send_launch(job.pk)
        Job.objects.filter(pk=job.pk).update(stop_requested_at=timezone.now(), stop_reason="cancel")
        request_stop(job.pk)

    raw = {name: message for name, message, _ in sent.sent}
    assert set(raw) == {TASK_LAUNCH, TASK_STOP}
    launch = _opened(raw[TASK_LAUNCH], key=_key(NODE))
    stop = _opened(raw[TASK_STOP], key=_key(NODE))
    assert isinstance(launch, Launch) and (launch.node, launch.job_id, launch.attempt) == (
        NODE,
        job.pk,
        1,
    )
    assert isinstance(stop, Stop) and (stop.node, stop.job_id, stop.reason) == (
        NODE,
        job.pk,
        "cancel",
    )
    # node-2's key (a genuine key of another node) verifies neither.
    for message in raw.values():
        with pytest.raises(SignatureError) as caught:
            _opened(message, key=_key(OTHER))
        assert caught.value.reason == "bad_signature"


def test_a_node_without_a_key_is_sent_nothing(caplog):
    make_node("keyless", gpus=[{"mode": "whole"}])
    team = make_team("vision", limit_units=None)
    job = make_job(
        team=team,
        user=make_user("alice", team=team),
        state=JobState.ASSIGNED,
        assigned_at=timezone.now(),
    )
    allocate(job, ["GPU-keyless-0"])

    with capture_sent_messages() as sent:
        send_launch(job.pk)

    assert sent.sent == []
    assert "not sending launch to keyless: node 'keyless' has no key" in caplog.text
    assert not job.dispatches.exists()  # so the reaper tries again once it has one
