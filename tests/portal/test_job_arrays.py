"""Job arrays (sweeps): one submit makes N jobs, a throttle caps how many run at once, and
the array is read, cancelled and its failed members resubmitted as one."""

from __future__ import annotations

import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.agents.dispatch import launch_env
from portal.agents.testing import (
    capture_sent_messages,
    deliver,
    finished,
    register_node,
    started,
)
from portal.jobs.arrays import array_submit, validate_array_request
from portal.jobs.models import HOLDING_STATES, Job, JobArray, JobEvent, JobState
from portal.jobs.testing import make_team, make_user, token_client
from portal.scheduling.service import run_schedule_pass

pytestmark = pytest.mark.django_db

NODE = "node-1"
EIGHT_GPUS = {"gpus": [{"mode": "whole", "count": 8}]}
BODY = {
    "name": "sweep",
    "team": "vision",
    "image": "python:3.11-slim",
    "command": ["python", "train.py"],
    "env": {"SEED": "7"},
    "gpu": {"kind": "whole", "count": 1},
    "time_limit_s": 600,
}


@pytest.fixture
def node():
    return register_node(NODE, description=EIGHT_GPUS)


def _submit(client, array, **fields):
    return client.post("/api/v1/jobs/", {**BODY, **fields, "array": array}, format="json")


# --- submit -------------------------------------------------------------------------------


def test_a_count_makes_that_many_members_each_with_its_index(world, alice_api, node):
    response = _submit(alice_api, {"count": 3, "max_running": 2})

    assert response.status_code == 201, response.json()
    body = response.json()
    array = JobArray.objects.get(pk=body["id"])
    assert response["Location"] == f"/api/v1/arrays/{array.pk}/"
    assert (array.size, array.max_running, array.team, array.user) == (
        3,
        2,
        world.vision,
        world.alice,
    )
    jobs = list(Job.objects.filter(array=array).order_by("array_index"))
    assert body["job_ids"] == [job.pk for job in jobs]
    assert [job.array_index for job in jobs] == [0, 1, 2]
    assert {job.state for job in jobs} == {JobState.PENDING}
    assert body["counts"]["PENDING"] == 3 and body["counts"]["RUNNING"] == 0
    assert body["jobs"][1] == {
        "id": jobs[1].pk,
        "index": 1,
        "state": "PENDING",
        "values": {},
        "exit_code": None,
        "pending_code": None,
    }
    # The agent is told its index (and array); the stored env stays the user's.
    assert launch_env(jobs[2]) == {
        "SEED": "7",
        "PORTAL_ARRAY_ID": str(array.pk),
        "PORTAL_ARRAY_INDEX": "2",
    }
    assert jobs[2].env == {"SEED": "7"}
    event = JobEvent.objects.get(job=jobs[2])
    assert event.message == f"submitted by alice; member 2 of array {array.pk}"
    detail = alice_api.get(f"/api/v1/jobs/{jobs[2].pk}/").json()
    assert detail["array"] == {"id": array.pk, "index": 2}


def test_a_sweep_makes_one_member_per_combination_in_product_order(alice_api, node):
    response = _submit(alice_api, {"values": {"lr": [0.1, 0.01], "bs": [32, 64]}})

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["size"] == 4
    assert body["values"] == {"lr": ["0.1", "0.01"], "bs": ["32", "64"]}
    # The names in the order given, the last varying fastest (itertools.product).
    assert [job["values"] for job in body["jobs"]] == [
        {"lr": "0.1", "bs": "32"},
        {"lr": "0.1", "bs": "64"},
        {"lr": "0.01", "bs": "32"},
        {"lr": "0.01", "bs": "64"},
    ]
    third = Job.objects.get(pk=body["job_ids"][2])
    assert launch_env(third) == {
        "SEED": "7",
        "lr": "0.01",
        "bs": "32",
        "PORTAL_ARRAY_ID": str(body["id"]),
        "PORTAL_ARRAY_INDEX": "2",
    }


def test_sweep_values_may_be_text_numbers_or_booleans(alice_api, node):
    response = _submit(alice_api, {"values": {"OPT": ["adam", "sgd"], "AMP": [True, False]}})
    assert response.status_code == 201, response.json()
    assert response.json()["values"] == {"OPT": ["adam", "sgd"], "AMP": ["true", "false"]}


@pytest.mark.parametrize(
    ("array", "field", "says"),
    [
        ({"count": 0}, "array.count", "allowed: a whole number from 1 to 1000"),
        ({"count": 1001}, "array.count", "1001 is out of range"),
        ({"count": "many"}, "array.count", "is not a whole number"),
        ({}, "array", "count or values: required"),
        ({"count": 2, "values": {"lr": [1]}}, "array", "not both"),
        ({"values": {"lr": []}}, "array.values.lr", "a non-empty list"),
        ({"values": {"lr": [None]}}, "array.values.lr", "None is not allowed"),
        ({"values": {"lr": [{"a": 1}]}}, "array.values.lr", "is not allowed"),
        ({"values": {"lr": [1, 1]}}, "array.values.lr", "'1' is listed twice"),
        ({"values": {"1lr": [1]}}, "array.values.1lr", "not an env variable name"),
        ({"values": {"PORTAL_X": [1]}}, "array.values.PORTAL_X", "reserved"),
        ({"values": {"SEED": [1, 2]}}, "array.values.SEED", "also in env"),
        ({"values": "lr=1"}, "array.values", "must be an object"),
        ({"count": 3, "max_running": 0}, "array.max_running", "out of range"),
        ({"count": 3, "shards": 2}, "array.shards", "allowed: count, values, max_running"),
        (5, "array", "must be an object"),
    ],
)
def test_a_bad_spec_is_a_400_naming_the_field_and_stores_nothing(
    alice_api, node, array, field, says
):
    response = _submit(alice_api, array)

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert field in errors, errors
    assert says in errors[field]
    assert (JobArray.objects.count(), Job.objects.count(), JobEvent.objects.count()) == (0, 0, 0)


def test_a_sweep_above_the_maximum_is_refused_with_the_sizes(alice_api, node, settings):
    settings.ARRAY_MAX = 10
    response = _submit(alice_api, {"values": {"a": [1, 2, 3, 4], "b": [1, 2, 3]}})
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "array.values": "4 x 3 = 12 combinations is too many; allowed: at most 10 "
        "(PORTAL_ARRAY_MAX)"
    }
    assert JobArray.objects.count() == 0


def test_the_spec_and_the_jobs_fields_are_checked_together(alice_api, node):
    response = _submit(alice_api, {"count": -1}, gpu={"kind": "tpu"})
    assert response.status_code == 400
    assert {"gpu.kind", "array.count"} <= set(response.json()["errors"])
    assert Job.objects.count() == 0


def _batches(model, count):
    """INSERT statements for ``count`` rows of ``model`` (the database's parameter limit may
    split them: SQLite's 999 does, PostgreSQL's does not)."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    rows = [model() for _ in range(count)]
    return math.ceil(count / max(connection.ops.bulk_batch_size(fields, rows), 1))


def test_an_array_costs_a_few_statements_whatever_its_size(world, node):
    def submit(count):
        request = validate_array_request({**BODY, "array": {"count": count}}, user=world.alice)
        with CaptureQueriesContext(connection) as queries:
            array_submit(user=world.alice, request=request)
        return len(queries)

    one, thousand = submit(1), submit(1000)
    # The array, the jobs and their events are inserted in batches: 1,000 members cost only
    # the extra batches of the jobs' bulk INSERT (their events are one statement, up to 5,000
    # rows: portal.bulk.insert_rows), not 1,000 x what one costs.
    extra = _batches(Job, 1000) - 1
    assert thousand == one + extra
    # Two savepoints and their releases, the array, the jobs, their events.
    assert one == 7
    assert Job.objects.filter(array__size=1000).count() == 1000


# --- the throttle, through real scheduling passes -----------------------------------------


def _pass(capture_callbacks):
    """One scheduling pass; the launch messages it sent."""
    with capture_sent_messages() as sent, capture_callbacks(execute=True):
        run_schedule_pass()
    return [message for message, _ in sent.launches()]


def _most_held_at_once(array: JobArray) -> int:
    """Over the members' events, in the order they were written: the most members holding
    slices (ASSIGNED or RUNNING) at once."""
    holding: set[int] = set()
    most = 0
    for job_id, to_state in (
        JobEvent.objects.filter(job__array=array).order_by("id").values_list("job_id", "to_state")
    ):
        if to_state in HOLDING_STATES:
            holding.add(job_id)
        else:
            holding.discard(job_id)
        most = max(most, len(holding))
    return most


def test_a_100_member_array_with_max_running_4_never_runs_more_than_4(
    node, django_capture_on_commit_callbacks
):
    team = make_team("sweeps", guaranteed_units=8.0, limit_units=None)
    alice = make_user("alice", team=team)
    body = {**BODY, "team": "sweeps", "array": {"count": 100, "max_running": 4}}
    response = token_client(alice).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    array = JobArray.objects.get(pk=response.json()["id"])

    throttled_seen = False
    for turn in range(200):
        for launch in _pass(django_capture_on_commit_callbacks):
            job = Job.objects.get(pk=launch["job_id"])
            assert launch["env"]["PORTAL_ARRAY_INDEX"] == str(job.array_index)
            deliver(started(job.pk, launch["attempt"]))
        waiting = Job.objects.filter(array=array, state=JobState.PENDING)
        if waiting.exists():
            codes = set(waiting.values_list("pending_code", flat=True))
            assert codes == {"ARRAY_THROTTLE"}, codes  # 8 GPUs: only the throttle holds them
            throttled_seen = True
        running = list(Job.objects.filter(array=array, state=JobState.RUNNING).order_by("pk"))
        assert len(running) <= 4
        if not running:
            break
        # End one or two at a time, so the array refills from different counts.
        for job in running[: 1 + turn % 2]:
            deliver(finished(job.pk, job.attempt, outcome="succeeded", exit_code=0))
    states = set(Job.objects.filter(array=array).values_list("state", flat=True))
    assert states == {JobState.SUCCEEDED}
    assert throttled_seen
    assert _most_held_at_once(array) == 4


def test_a_throttled_member_says_why_it_waits(world, alice_api, node, settings):
    response = _submit(alice_api, {"count": 3, "max_running": 1})
    array_id = response.json()["id"]
    run_schedule_pass()

    body = alice_api.get(f"/api/v1/arrays/{array_id}/").json()
    assert body["counts"]["ASSIGNED"] == 1 and body["counts"]["PENDING"] == 2
    last = Job.objects.get(pk=body["job_ids"][2])
    assert last.pending_code == "ARRAY_THROTTLE"
    assert last.pending_message == (
        f"array {array_id} runs 1 of at most 1; members waiting before this one: 1"
    )
    assert body["jobs"][2]["pending_code"] == "ARRAY_THROTTLE"


# --- cancel and resubmit ----------------------------------------------------------------------


def test_cancel_all_ends_the_waiting_members_and_stops_the_running_ones(
    world, alice_api, node, django_capture_on_commit_callbacks
):
    response = _submit(alice_api, {"count": 6, "max_running": 2})
    array_id = response.json()["id"]
    launches = _pass(django_capture_on_commit_callbacks)
    assert len(launches) == 2
    deliver(started(launches[0]["job_id"], launches[0]["attempt"]))

    with capture_sent_messages() as sent, django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post(f"/api/v1/arrays/{array_id}/cancel/")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert sorted(body["cancelled"]) == sorted(body["job_ids"])
    assert body["counts"]["CANCELLED"] == 4
    held = sorted(launch["job_id"] for launch in launches)
    assert sorted(message["job_id"] for message, _ in sent.stops()) == held
    for launch in launches:
        outcome = finished(launch["job_id"], launch["attempt"], outcome="cancelled", exit_code=None)
        deliver(outcome)
    body = alice_api.get(f"/api/v1/arrays/{array_id}/").json()
    assert body["counts"]["CANCELLED"] == 6
    event = JobEvent.objects.filter(job_id=body["job_ids"][5]).last()
    assert (event.to_state, event.message) == ("CANCELLED", "cancelled by alice")
    # Nothing left to cancel: no error, nothing cancelled.
    again = alice_api.post(f"/api/v1/arrays/{array_id}/cancel/")
    assert (again.status_code, again.json()["cancelled"]) == (200, [])


def test_resubmit_failed_makes_new_jobs_only_for_the_failed_members(world, alice_api, node):
    response = _submit(alice_api, {"values": {"lr": ["1", "2", "3", "4"]}, "max_running": 2})
    array_id = response.json()["id"]
    ids = response.json()["job_ids"]
    ends = (JobState.SUCCEEDED, JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED)
    for job_id, state in zip(ids, ends, strict=True):
        Job.objects.filter(pk=job_id).update(state=state)

    response = alice_api.post(f"/api/v1/arrays/{array_id}/resubmit-failed/")

    assert response.status_code == 201, response.json()
    body = response.json()
    made = body["resubmitted"]
    assert [(r["index"], r["from_job"]) for r in made] == [(1, ids[1]), (2, ids[2])]
    assert body["job_ids"] == [ids[0], made[0]["job"], made[1]["job"], ids[3]]
    assert sorted(body["replaced_job_ids"]) == [ids[1], ids[2]]
    assert {k: v for k, v in body["counts"].items() if v} == {
        "SUCCEEDED": 1,
        "PENDING": 2,
        "CANCELLED": 1,
    }
    new = Job.objects.get(pk=made[1]["job"])
    assert (new.array_id, new.array_index, new.env) == (array_id, 2, {"SEED": "7", "lr": "3"})
    assert JobEvent.objects.filter(job=new).last().message == f"resubmitted from job {ids[2]}"
    old_event = JobEvent.objects.filter(job_id=ids[2]).last()
    assert old_event.message == f"resubmitted by alice as job {new.pk}"
    # Again: the new members have not failed, so nothing more is made.
    again = alice_api.post(f"/api/v1/arrays/{array_id}/resubmit-failed/")
    assert (again.status_code, again.json()["resubmitted"]) == (200, [])
    assert Job.objects.filter(array_id=array_id).count() == 6


def test_resubmitting_one_member_keeps_it_in_its_array_at_its_index(world, alice_api, node):
    response = _submit(alice_api, {"count": 2})
    array_id, ids = response.json()["id"], response.json()["job_ids"]
    Job.objects.filter(pk=ids[1]).update(state=JobState.FAILED)

    response = alice_api.post(f"/api/v1/jobs/{ids[1]}/resubmit/")

    assert response.status_code == 201
    assert response.json()["array"] == {"id": array_id, "index": 1}
    body = alice_api.get(f"/api/v1/arrays/{array_id}/").json()
    assert body["job_ids"] == [ids[0], response.json()["id"]]


# --- who sees and acts --------------------------------------------------------------------------


def test_another_teams_array_is_a_404_and_a_team_mate_may_not_act(world, alice_api, node):
    array_id = _submit(alice_api, {"count": 2}).json()["id"]
    bob = token_client(world.bob)
    response = bob.get(f"/api/v1/arrays/{array_id}/")
    assert response.status_code == 404
    assert response.json()["errors"]["detail"] == (
        f"no job array {array_id} among the arrays of your teams"
    )
    assert bob.post(f"/api/v1/arrays/{array_id}/cancel/").status_code == 404

    carol = token_client(make_user("carol", team=world.vision))
    assert carol.get(f"/api/v1/arrays/{array_id}/").status_code == 200
    response = carol.post(f"/api/v1/arrays/{array_id}/cancel/")
    assert response.status_code == 403
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.PENDING}

    vera = token_client(world.vera)  # an admin of the team
    assert vera.post(f"/api/v1/arrays/{array_id}/cancel/").status_code == 200
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.CANCELLED}
