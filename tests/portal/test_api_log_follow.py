"""Following a log through the API: `?offset=N` gives the text after byte N, where to read
next, and whether the attempt is over; bad offsets are a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from portal.jobs.models import Job, JobLogChunk, JobState
from portal.jobs.testing import World, make_job
from portal.jobs.transitions import transition
from portal.tenants.tokens import token_issue

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(world: World) -> Job:
    return make_job(team=world.vision, user=world.alice, state=JobState.RUNNING)


def add_chunks(job: Job, *pieces: tuple[int, str], attempt: int = 1) -> None:
    for seq, data in pieces:
        JobLogChunk.objects.create(job=job, attempt=attempt, seq=seq, data=data)


def read(api: APIClient, job: Job, query: str) -> dict[str, Any]:
    response = api.get(f"/api/v1/jobs/{job.pk}/log/?format=json&{query}")
    assert response.status_code == 200, response.content
    return response.json()


def test_reading_on_from_next_offset_gives_each_byte_once(alice_api, running):
    add_chunks(running, (0, "héllo\n"), (1, "wörld\n"))  # é and ö are two bytes each

    first = read(alice_api, running, "offset=0")
    add_chunks(running, (2, "∑ done\n"))  # three bytes
    second = read(alice_api, running, f"offset={first['next_offset']}")
    third = read(alice_api, running, f"offset={second['next_offset']}")

    assert first == {
        "job": running.pk,
        "attempt": 1,
        "state": "RUNNING",
        "offset": 0,
        "next_offset": len("héllo\nwörld\n".encode()),
        "ended": False,
        "log": "héllo\nwörld\n",
    }
    assert (second["log"], second["next_offset"]) == (
        "∑ done\n",
        len("héllo\nwörld\n∑ done\n".encode()),
    )
    assert (third["log"], third["next_offset"], third["ended"]) == (
        "",
        second["next_offset"],
        False,
    )


def test_an_offset_inside_a_chunk_starts_there(alice_api, running):
    add_chunks(running, (0, "abc"), (1, "def"))

    assert read(alice_api, running, "offset=4")["log"] == "ef"
    assert read(alice_api, running, "offset=3")["log"] == "def"


def test_a_chunk_after_a_gap_waits_until_the_gap_is_filled_while_the_job_runs(alice_api, running):
    add_chunks(running, (0, "one\n"), (2, "three\n"))  # chunk 1 is still on its way

    before = read(alice_api, running, "offset=0")
    add_chunks(running, (1, "two\n"))
    after = read(alice_api, running, f"offset={before['next_offset']}")

    assert (before["log"], before["next_offset"]) == ("one\n", 4)
    assert after["log"] == "two\nthree\n"


def test_ended_says_the_attempt_is_over_and_the_last_read_has_everything(alice_api, running):
    add_chunks(running, (0, "partial "))
    offset = read(alice_api, running, "offset=0")["next_offset"]
    add_chunks(running, (1, "and the end\n"))
    transition(running.pk, to=JobState.SUCCEEDED, from_states=[JobState.RUNNING], exit_code=0)

    last = read(alice_api, running, f"offset={offset}")

    assert (last["log"], last["ended"], last["state"]) == ("and the end\n", True, "SUCCEEDED")


def test_an_earlier_attempt_of_a_requeued_job_is_ended(alice_api, world):
    job = make_job(team=world.vision, user=world.alice, state=JobState.RUNNING, attempt=2)
    add_chunks(job, (0, "first try\n"), attempt=1)

    earlier = read(alice_api, job, "offset=0&attempt=1")
    latest = read(alice_api, job, "offset=0")

    assert (earlier["log"], earlier["attempt"], earlier["ended"]) == ("first try\n", 1, True)
    assert (latest["log"], latest["attempt"], latest["ended"]) == ("", 2, False)


def test_plain_text_with_an_offset_carries_the_next_offset_in_headers(alice_api, running):
    add_chunks(running, (0, "hello world\n"))

    response = alice_api.get(f"/api/v1/jobs/{running.pk}/log/?offset=6", HTTP_ACCEPT="*/*")

    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == "world\n"
    assert (response["X-Log-Next-Offset"], response["X-Log-Ended"]) == ("12", "false")


def test_without_an_offset_the_log_is_whole_as_before(alice_api, running):
    add_chunks(running, (0, "one\n"), (2, "three\n"))

    whole = read(alice_api, running, "")

    assert whole == {"job": running.pk, "attempt": 1, "state": "RUNNING", "log": "one\nthree\n"}


@pytest.mark.parametrize("offset", ["-1", "abc", "1.5", "99999999999999999999"])
def test_a_bad_offset_is_a_400_naming_the_field(alice_api, running, offset):
    response = alice_api.get(f"/api/v1/jobs/{running.pk}/log/?format=json&offset={offset}")

    assert response.status_code == 400
    message = response.json()["errors"]["offset"]
    assert repr(offset) in message
    assert "allowed: a whole number of bytes from 0" in message


def test_an_offset_beyond_the_log_is_a_400_with_its_size(alice_api, running):
    add_chunks(running, (0, "12345"))

    response = alice_api.get(f"/api/v1/jobs/{running.pk}/log/?format=json&offset=6")

    assert response.status_code == 400
    assert response.json() == {
        "errors": {"offset": "6 is beyond the 5 bytes of attempt 1's log so far; allowed: 0 to 5"}
    }


def test_a_read_costs_the_same_queries_however_long_the_log(alice_api, running):
    def queries_for(chunks: int) -> int:
        JobLogChunk.objects.filter(job=running).delete()
        add_chunks(running, *[(seq, f"line {seq}\n") for seq in range(chunks)])
        with CaptureQueriesContext(connection) as captured:
            read(alice_api, running, "offset=3")
        return len(captured)

    read(alice_api, running, "offset=0")  # a token's first use also records last_used_at
    assert queries_for(3) == queries_for(300)


def test_another_teams_job_log_is_a_404(world, running):
    bob = APIClient()
    bob.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=world.bob)}")

    response = bob.get(f"/api/v1/jobs/{running.pk}/log/?format=json&offset=0")

    assert response.status_code == 404
