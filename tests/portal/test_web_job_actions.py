"""Job actions on the pages (hold, release, cancel, resubmit) and the job list's columns,
filters, search and pages: who sees which button, what each POST changes, and what it says
when the job's state does not allow it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.jobs.models import Job, JobDependency, JobEvent, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user, token_client
from portal.tenants.models import Membership, Team

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def htmx_from_row(job: Job) -> dict[str, str]:
    return {**HTMX, "HTTP_HX_TARGET": f"job-row-{job.pk}"}


def htmx_from_page() -> dict[str, str]:
    return {**HTMX, "HTTP_HX_TARGET": "job-live"}


@pytest.fixture
def vision() -> Team:
    return make_team("vision", guaranteed_units=2.0, limit_units=4.0, max_priority="high")


@pytest.fixture
def nlp() -> Team:
    return make_team("nlp")


@pytest.fixture
def alice(vision: Team) -> Any:
    return make_user("alice", team=vision)


@pytest.fixture
def carl(vision: Team) -> Any:
    """Alice's team mate: sees her jobs, may not act on them."""
    return make_user("carl", team=vision)


@pytest.fixture
def vera(vision: Team) -> Any:
    return make_user("vera", team=vision, role=Membership.Role.ADMIN)


@pytest.fixture
def bob(nlp: Team) -> Any:
    return make_user("bob", team=nlp)


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def html(response: Any) -> str:
    return response.content.decode()


def row_of(page: str, job: Job) -> str:
    """The list's row of ``job``."""
    start = page.index(f'<tr id="job-row-{job.pk}"')
    return page[start : page.index("</tr>", start)]


def buttons(fragment: str) -> list[str]:
    """The action buttons and links of a row or of a job page's head, in order."""
    return re.findall(r'class="button[^"]*"[^>]*>([^<]+)</(?:button|a)>', fragment)


def listed(page: str) -> list[int]:
    """The ids of the jobs a list page shows, top to bottom."""
    return [int(pk) for pk in re.findall(r'<tr id="job-row-(\d+)"', page)]


def state_of(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


# --- hold and release ------------------------------------------------------------------------


def test_hold_from_a_row_of_the_list_swaps_that_row_to_held(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice, name="sweep", pending_code="NO_FIT", queue_position=2)

    response = client_for(alice).post(
        reverse("web:job_hold", args=[job.pk]), {"next": "/?state=PENDING"}, **htmx_from_row(job)
    )
    row = html(response).strip()

    assert response.status_code == 200
    assert state_of(job) == JobState.HELD
    assert row.startswith(f'<tr id="job-row-{job.pk}"') and "<html" not in row
    assert '<span class="badge state-HELD">HELD</span>' in row
    assert "NO_FIT" not in row  # holding clears the scheduler's explanation
    assert buttons(row) == ["Release", "Cancel"]
    # The row's forms still go back to the filtered list without JavaScript.
    assert row.count('name="next" value="/?state=PENDING"') == 2


def test_release_from_the_job_page_puts_the_job_back_in_the_queue(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice, state=JobState.HELD)
    queued_before = job.queued_since

    response = client_for(alice).post(reverse("web:job_release", args=[job.pk]), **htmx_from_page())
    fragment = html(response).strip()

    job.refresh_from_db()
    assert (response.status_code, job.state) == (200, JobState.PENDING)
    assert job.queued_since > queued_before
    assert fragment.startswith('<div id="job-live"') and 'id="job-state">PENDING<' in fragment
    assert buttons(fragment) == ["Hold", "Cancel job"]
    messages = list(job.events.order_by("pk").values_list("message", flat=True))
    assert messages[-1] == "released by alice"


def test_hold_without_javascript_returns_to_the_filtered_list_with_a_message(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice)
    client = client_for(alice)

    response = client.post(
        reverse("web:job_hold", args=[job.pk]), {"next": "/?state=PENDING&mine=1&q=sweep"}
    )

    assert response.status_code == 302
    assert response.url == "/?state=PENDING&mine=1&q=sweep"
    assert state_of(job) == JobState.HELD
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"Job {job.pk} held: it waits until you release it."
    ]


def test_a_next_on_another_site_is_ignored_for_the_jobs_own_page(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice, state=JobState.HELD)

    response = client_for(alice).post(
        reverse("web:job_release", args=[job.pk]), {"next": "https://elsewhere.example/"}
    )

    assert response.status_code == 302
    assert response.url == reverse("web:job_detail", args=[job.pk])
    assert state_of(job) == JobState.PENDING


@pytest.mark.parametrize(
    ("action", "state", "message"),
    [
        ("hold", JobState.RUNNING, "is RUNNING; only a PENDING job can be held"),
        ("hold", JobState.SUCCEEDED, "is SUCCEEDED; only a PENDING job can be held"),
        ("release", JobState.PENDING, "is PENDING; only a HELD job can be released"),
        ("cancel", JobState.FAILED, "already ended (FAILED); nothing to cancel"),
    ],
)
def test_an_action_the_state_does_not_allow_says_why_and_changes_nothing(
    alice: Any, vision: Team, action: str, state: str, message: str
) -> None:
    job = make_job(team=vision, user=alice, state=state)
    events_before = job.events.count()

    response = client_for(alice).post(
        reverse(f"web:job_{action}", args=[job.pk]), **htmx_from_row(job)
    )

    assert response.status_code == 409
    assert html(response) == (f'<div class="form-errors" role="alert">job {job.pk} {message}</div>')
    # Into the message box outside the polling table, so the next poll does not wipe it.
    assert response["HX-Retarget"] == "#job-action-message"
    assert response["HX-Reswap"] == "innerHTML"
    assert state_of(job) == state
    assert job.events.count() == events_before


def test_a_refused_action_without_javascript_shows_the_reason_on_the_job_page(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice, state=JobState.RUNNING)
    client = client_for(alice)

    response = client.post(reverse("web:job_hold", args=[job.pk]), follow=True)

    assert response.redirect_chain == [(reverse("web:job_detail", args=[job.pk]), 302)]
    assert f"job {job.pk} is RUNNING; only a PENDING job can be held" in html(response)
    assert state_of(job) == JobState.RUNNING


def test_the_job_page_has_a_box_for_refused_actions_outside_its_polling_part(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice)

    page = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk])))
    listing = html(client_for(alice).get(reverse("web:job_list")))

    assert page.index('id="job-action-message"') < page.index('id="job-live"')
    assert listing.index('id="job-action-message"') < listing.index('id="job-table"')


@pytest.mark.parametrize("action", ["hold", "release", "cancel"])
def test_a_team_mate_may_not_act_on_my_job(
    alice: Any, carl: Any, vision: Team, action: str
) -> None:
    state = JobState.HELD if action == "release" else JobState.PENDING
    job = make_job(team=vision, user=alice, state=state)

    response = client_for(carl).post(
        reverse(f"web:job_{action}", args=[job.pk]), **htmx_from_row(job)
    )

    assert response.status_code == 403
    assert state_of(job) == state


@pytest.mark.parametrize("action", ["hold", "release", "cancel"])
def test_another_teams_job_is_a_404_and_stays_as_it_was(
    alice: Any, bob: Any, vision: Team, action: str
) -> None:
    state = JobState.HELD if action == "release" else JobState.PENDING
    job = make_job(team=vision, user=alice, state=state)

    response = client_for(bob).post(reverse(f"web:job_{action}", args=[job.pk]))

    assert response.status_code == 404
    assert state_of(job) == state


def test_a_team_admin_holds_and_releases_a_members_job(alice: Any, vera: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)
    client = client_for(vera)

    client.post(reverse("web:job_hold", args=[job.pk]), **htmx_from_row(job))
    assert state_of(job) == JobState.HELD
    client.post(reverse("web:job_release", args=[job.pk]), **htmx_from_row(job))
    assert state_of(job) == JobState.PENDING


def test_actions_are_posts_with_the_csrf_token(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)

    assert client_for(alice).get(reverse("web:job_hold", args=[job.pk])).status_code == 405
    assert strict.post(reverse("web:job_hold", args=[job.pk])).status_code == 403
    assert state_of(job) == JobState.PENDING


def test_cancel_from_a_row_swaps_the_row_and_offers_a_resubmit(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)

    row = html(
        client_for(alice).post(reverse("web:job_cancel", args=[job.pk]), **htmx_from_row(job))
    )

    assert state_of(job) == JobState.CANCELLED
    assert '<span class="badge state-CANCELLED">CANCELLED</span>' in row
    assert buttons(row) == ["Resubmit"]
    assert f'href="/jobs/new/?from={job.pk}"' in row


# --- which buttons show ----------------------------------------------------------------------


def test_each_row_offers_only_the_actions_its_state_and_the_user_allow(
    alice: Any, carl: Any, vera: Any, vision: Team, nlp: Team
) -> None:
    node = make_node("node-1", gpus=[{"mode": "whole"}, {"mode": "whole"}])
    pending = make_job(team=vision, user=alice, name="pending")
    held = make_job(team=vision, user=alice, state=JobState.HELD, name="held")
    running = make_job(team=vision, user=alice, state=JobState.RUNNING, name="running", node=node)
    stopping = make_job(
        team=vision,
        user=alice,
        state=JobState.RUNNING,
        name="stopping",
        stop_requested_at=timezone.now(),
        stop_reason="cancel",
    )
    lost = make_job(team=vision, user=alice, state=JobState.LOST, name="lost")
    done = make_job(team=vision, user=alice, state=JobState.SUCCEEDED, exit_code=0, name="done")
    carls = make_job(team=vision, user=carl, name="carls")
    allocate(running, ["GPU-node-1-0"])

    mine = html(client_for(alice).get(reverse("web:job_list")))
    mate = html(client_for(carl).get(reverse("web:job_list")))
    admin = html(client_for(vera).get(reverse("web:job_list")))

    expected = {
        pending: ["Hold", "Cancel"],
        held: ["Release", "Cancel"],
        running: ["Cancel"],
        stopping: [],  # its cancel was asked already
        lost: [],  # about to be requeued: nothing to do yet
        done: ["Resubmit"],
        carls: [],
    }
    assert {job.name: buttons(row_of(mine, job)) for job in expected} == {
        job.name: actions for job, actions in expected.items()
    }
    assert {job.name: buttons(row_of(admin, job)) for job in expected} == {
        **{job.name: actions for job, actions in expected.items()},
        "carls": ["Hold", "Cancel"],
    }
    assert {job.name: buttons(row_of(mate, job)) for job in expected} == {
        **{job.name: [] for job in expected},
        "carls": ["Hold", "Cancel"],
    }


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (JobState.PENDING, ["Hold", "Cancel job"]),
        (JobState.HELD, ["Release", "Cancel job"]),
        (JobState.RUNNING, ["Cancel job"]),
        (JobState.SUCCEEDED, ["Resubmit"]),
        (JobState.CANCELLED, ["Resubmit"]),
    ],
)
def test_the_job_page_offers_the_actions_of_its_state(
    alice: Any, carl: Any, vision: Team, state: str, expected: list[str]
) -> None:
    job = make_job(team=vision, user=alice, state=state)
    url = reverse("web:job_detail", args=[job.pk])

    head = html(client_for(alice).get(url)).split('class="actions"', 1)[1].split("</div>", 1)[0]
    mate_head = html(client_for(carl).get(url)).split('class="actions"', 1)[1]

    assert buttons(head) == expected
    assert buttons(mate_head.split("</div>", 1)[0]) == []


# --- resubmit --------------------------------------------------------------------------------


def ended_job(team: Team, user: Any, **fields: Any) -> Job:
    base: dict[str, Any] = {
        "state": JobState.FAILED,
        "name": "resnet-train",
        "gpu_kind": "mig",
        "gpu_profile": "3g.40gb",
        "exit_code": 1,
    }
    base.update(fields)
    job = make_job(team=team, user=user, **base)
    Job.objects.filter(pk=job.pk).update(
        command=["python", "-c", "print('hi there')"],
        env={"SEED": "7", "MODE": "fast"},
        priority="high",
        time_limit_s=900,
        preemptible=False,
    )
    job.refresh_from_db()
    return job


def form_of(page: str) -> dict[str, str]:
    """What the submit form would send as it is shown (inputs, textareas, chosen options)."""
    values: dict[str, str] = {}
    for tag in re.findall(r"<input [^>]*>", page):
        name = re.search(r'name="([^"]+)"', tag)
        if not name or name.group(1) == "csrfmiddlewaretoken":
            continue
        if 'type="checkbox"' in tag:
            if " checked" in tag:
                values[name.group(1)] = "on"
            continue
        value = re.search(r'value="([^"]*)"', tag)
        values[name.group(1)] = value.group(1) if value else ""
    for name, text in re.findall(r'<textarea [^>]*name="([^"]+)"[^>]*>([^<]*)</textarea>', page):
        values[name] = text
    for name, options in re.findall(r'<select [^>]*name="([^"]+)"[^>]*>(.*?)</select>', page, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', options)
        values[name] = chosen.group(1) if chosen else ""
    return {
        name: value.replace("&quot;", '"').replace("&#x27;", "'") for name, value in values.items()
    }


def test_resubmit_opens_the_form_filled_with_the_jobs_request(alice: Any, vision: Team) -> None:
    first = make_job(team=vision, user=alice, state=JobState.SUCCEEDED, name="prepare")
    job = ended_job(vision, alice)
    JobDependency.objects.create(job=job, depends_on=first, kind="after_any")

    response = client_for(alice).get(reverse("web:job_submit"), {"from": job.pk})
    page = html(response)

    assert response.status_code == 200
    assert f'Resubmit of job <a href="/jobs/{job.pk}/">{job.pk} (resnet-train)</a>' in page
    assert form_of(page) == {
        "from": str(job.pk),
        "name": "resnet-train",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": "python -c \"print('hi there')\"",
        "env": "MODE=fast\nSEED=7",  # sorted: the same on every database
        "gpu_kind": "mig",
        "gpu_count": "1",
        "gpu_profile": "3g.40gb",
        "gpu_model": "",
        "priority": "high",
        "time_limit_s": "900",
        "depends_on": f"{first.pk}:after_any",
    }  # and "preemptible" is not ticked, as the job was not


def test_the_edited_resubmit_makes_a_new_job_and_links_both(alice: Any, vision: Team) -> None:
    job = ended_job(vision, alice)
    client = client_for(alice)
    form = form_of(html(client.get(reverse("web:job_submit"), {"from": job.pk})))

    form.update(name="resnet-train-2", time_limit_s="1800")
    response = client.post(reverse("web:job_submit"), form)

    new = Job.objects.exclude(pk=job.pk).get()
    assert response.status_code == 302 and response.url == f"/jobs/{new.pk}/"
    assert (new.name, new.time_limit_s, new.state, new.user) == (
        "resnet-train-2",
        1800,
        JobState.PENDING,
        alice,
    )
    assert (new.command, new.env, new.gpu_kind, new.gpu_profile, new.priority) == (
        job.command,
        job.env,
        "mig",
        "3g.40gb",
        "high",
    )
    assert new.preemptible is False
    assert JobEvent.objects.filter(
        job=job, message=f"resubmitted by alice as job {new.pk}"
    ).exists()
    assert JobEvent.objects.filter(job=new, message=f"resubmitted from job {job.pk}").exists()
    assert state_of(job) == JobState.FAILED


def test_an_elastic_multi_node_request_survives_the_form(alice: Any, vision: Team) -> None:
    job = ended_job(vision, alice, gpu_kind="whole", gpu_profile="", gpu_count=4)
    Job.objects.filter(pk=job.pk).update(gpu_min_count=2, multi_node=True)
    client = client_for(alice)

    page = html(client.get(reverse("web:job_submit"), {"from": job.pk}))
    form = form_of(page)
    client.post(reverse("web:job_submit"), form)

    assert "an elastic gang, which may start with 2 of its GPUs" in page
    assert (form["gpu_min_count"], form["gpu_multi_node"]) == ("2", "true")
    new = Job.objects.exclude(pk=job.pk).get()
    assert (new.gpu_count, new.gpu_min_count, new.multi_node) == (4, 2, True)


def test_a_team_mates_job_can_be_copied_but_not_resubmitted(
    alice: Any, carl: Any, vision: Team
) -> None:
    job = ended_job(vision, alice)
    client = client_for(carl)

    page = html(client.get(reverse("web:job_submit"), {"from": job.pk}))
    form = form_of(page)
    client.post(reverse("web:job_submit"), {**form, "name": "carls-copy"})

    assert "A copy of job" in page and "from" not in form
    copy = Job.objects.get(name="carls-copy")
    assert copy.user == carl
    assert not JobEvent.objects.filter(job=job, message__startswith="resubmitted").exists()


def test_a_resubmit_of_someone_elses_job_sent_by_hand_is_refused(
    alice: Any, carl: Any, vision: Team
) -> None:
    job = ended_job(vision, alice)
    form = form_of(html(client_for(alice).get(reverse("web:job_submit"), {"from": job.pk})))

    response = client_for(carl).post(reverse("web:job_submit"), form)

    assert response.status_code == 403
    assert Job.objects.count() == 1


def test_a_resubmit_of_a_job_that_has_not_ended_says_so_and_stores_nothing(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice, name="still-waiting")
    client = client_for(alice)
    form = form_of(html(client.get(reverse("web:job_submit"), {"from": job.pk})))
    assert "from" not in form  # a pending job is copied, not resubmitted

    response = client.post(reverse("web:job_submit"), {**form, "from": job.pk})

    assert response.status_code == 422
    assert (
        f"Resubmit: job {job.pk} is PENDING; only an ended job (CANCELLED, FAILED, SUCCEEDED, "
        "TIMED_OUT) can be resubmitted"
    ) in html(response)
    assert Job.objects.count() == 1


def test_the_form_refuses_a_bad_from_and_hides_another_teams_job(
    alice: Any, bob: Any, nlp: Team
) -> None:
    foreign = ended_job(nlp, bob)
    client = client_for(alice)

    bad = client.get(reverse("web:job_submit"), {"from": "abc"})
    hidden = client.get(reverse("web:job_submit"), {"from": foreign.pk})
    missing = client.get(reverse("web:job_submit"), {"from": 999999})

    assert bad.status_code == 400
    assert (
        "Copy of job: &#x27;abc&#x27; is not a job id; allowed: the id of a job of your teams"
        in (html(bad))
    )
    assert (hidden.status_code, missing.status_code) == (404, 404)


# --- the list's columns ----------------------------------------------------------------------


def test_the_list_shows_the_estimated_start_and_the_run_time(alice: Any, vision: Team) -> None:
    now = timezone.now()
    eta = make_job(
        team=vision,
        user=alice,
        name="eta",
        pending_code="RESERVED",
        estimated_start_at=now + timedelta(hours=2, seconds=30),
    )
    unknown = make_job(team=vision, user=alice, name="unknown", pending_code="NO_FIT")
    held = make_job(team=vision, user=alice, state=JobState.HELD, name="held")
    running = make_job(
        team=vision, user=alice, state=JobState.RUNNING, started_at=now - timedelta(hours=1)
    )
    done = make_job(
        team=vision,
        user=alice,
        state=JobState.SUCCEEDED,
        started_at=now - timedelta(hours=3),
        finished_at=now - timedelta(hours=1, minutes=55),
    )
    never_ran = make_job(team=vision, user=alice, state=JobState.CANCELLED, name="never-ran")

    page = html(client_for(alice).get(reverse("web:job_list")))

    def cell(job: Job, label: str) -> str:
        row = row_of(page, job)
        text = row.split(f'data-label="{label}">', 1)[1].split("</td>", 1)[0]
        return re.sub(r"<[^>]+>|\s+", " ", text).strip()

    assert [cell(job, "Est. start") for job in (eta, unknown, held, running)] == [
        "in 2 hours",
        "unknown",
        "held",
        "—",
    ]
    assert [cell(job, "Run time") for job in (running, done, never_ran, eta)] == [
        "1h 00m",
        "1h 05m",
        "—",
        "—",
    ]


# --- filters, search and pages ----------------------------------------------------------------


@pytest.fixture
def many(alice: Any, carl: Any, vision: Team, nlp: Team) -> dict[str, Job]:
    Membership.objects.create(team=nlp, user=alice)
    start = timezone.now() - timedelta(hours=1)
    specs = [
        ("Train-ResNet", vision, alice, JobState.PENDING),
        ("resnet-eval", vision, carl, JobState.PENDING),
        ("bert-train", nlp, alice, JobState.RUNNING),
        ("retrain-all", vision, alice, JobState.SUCCEEDED),
        ("gpt-TRAIN", nlp, alice, JobState.PENDING),
        ("sweep", vision, carl, JobState.FAILED),
    ]
    return {
        name: make_job(
            team=team, user=user, name=name, state=state, submitted_at=start + timedelta(seconds=i)
        )
        for i, (name, team, user, state) in enumerate(specs)
    }


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({}, ["sweep", "gpt-TRAIN", "retrain-all", "bert-train", "resnet-eval", "Train-ResNet"]),
        ({"q": "train"}, ["gpt-TRAIN", "retrain-all", "bert-train", "Train-ResNet"]),
        ({"q": "  RESNET "}, ["resnet-eval", "Train-ResNet"]),
        ({"mine": "1"}, ["gpt-TRAIN", "retrain-all", "bert-train", "Train-ResNet"]),
        ({"mine": "1", "q": "train", "state": "PENDING"}, ["gpt-TRAIN", "Train-ResNet"]),
        ({"mine": "1", "q": "train", "team": "vision"}, ["retrain-all", "Train-ResNet"]),
        ({"q": "resnet", "team": "nlp"}, []),
        ({"q": "no-such-job"}, []),
    ],
)
def test_filters_and_search_combine(
    alice: Any, many: dict[str, Job], params: dict[str, str], names: list[str]
) -> None:
    page = html(client_for(alice).get(reverse("web:job_list"), params))

    assert listed(page) == [many[name].pk for name in names]
    if not names:
        assert "No jobs match these filters." in page


def test_the_filters_show_what_is_chosen_and_the_poll_keeps_them(
    alice: Any, many: dict[str, Job]
) -> None:
    params = {"q": "train", "mine": "1", "state": "PENDING"}
    page = html(client_for(alice).get(reverse("web:job_list"), params))
    fragment = html(client_for(alice).get(reverse("web:job_list"), params, **HTMX))

    assert 'name="q" value="train"' in page
    assert 'id="id_mine" name="mine" value="1" checked' in page
    assert 'hx-get="/?state=PENDING&amp;mine=1&amp;q=train"' in fragment


def test_the_list_pages_keep_the_filters_in_their_links(alice: Any, vision: Team) -> None:
    start = timezone.now() - timedelta(days=1)
    jobs = [
        make_job(
            team=vision, user=alice, name=f"train-{i}", submitted_at=start + timedelta(minutes=i)
        )
        for i in range(120)
    ]
    make_job(team=vision, user=alice, name="other")
    newest_first = [job.pk for job in reversed(jobs)]
    client = client_for(alice)
    params = {"q": "train", "mine": "1"}

    first = html(client.get(reverse("web:job_list"), params))
    second = html(client.get(reverse("web:job_list"), {**params, "page": "2"}))
    last = html(client.get(reverse("web:job_list"), {**params, "page": "3"}, **HTMX))
    beyond = html(client.get(reverse("web:job_list"), {**params, "page": "99"}))

    assert listed(first) == newest_first[:50]
    assert listed(second) == newest_first[50:100]
    assert listed(last) == newest_first[100:] and listed(beyond) == newest_first[100:]
    assert "Jobs 1–50 of 120" in first and "Jobs 101–120 of 120" in last
    assert 'href="/?mine=1&amp;q=train&amp;page=2" ' in first and "← Newer" not in first
    assert 'href="/?mine=1&amp;q=train" ' in second  # newer: page 1 is the plain address
    assert 'href="/?mine=1&amp;q=train&amp;page=3" ' in second
    assert 'hx-get="/?mine=1&amp;q=train&amp;page=3"' in last and "Older →" not in last


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        (
            {"mine": "yes"},
            "Mine only</a>: &#x27;yes&#x27; is not allowed; allowed: 1 (only my jobs)",
        ),
        ({"page": "two"}, "Page: &#x27;two&#x27; is not a page number; allowed: a whole number"),
        ({"page": "0"}, "Page: &#x27;0&#x27; is not a page number"),
        ({"q": "a\x00b"}, "Name</a>: must not contain a NUL character"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(
    alice: Any, many: dict[str, Job], params: dict[str, str], problem: str
) -> None:
    response = client_for(alice).get(reverse("web:job_list"), params)

    assert response.status_code == 400
    assert problem in html(response)
    assert listed(html(response)) == []


def test_the_job_list_costs_a_fixed_number_of_queries_however_many_jobs(
    alice: Any, carl: Any, vera: Any, vision: Team, nlp: Team, django_assert_num_queries: Any
) -> None:
    """Session, user, teams, the page's jobs (team, user and node joined), their count, and
    the user's memberships for the actions: 6, for one job or a full page of many."""
    Membership.objects.create(team=nlp, user=alice)
    node = make_node("node-1", gpus=[{"mode": "whole"}])
    client = client_for(alice)
    make_job(team=vision, user=alice)
    with django_assert_num_queries(6):
        client.get(reverse("web:job_list"))
    states = list(JobState)
    for i in range(80):
        make_job(
            team=(vision, nlp)[i % 2],
            user=(alice, carl, vera)[i % 3],
            name=f"job-{i}",
            state=states[i % len(states)],
            node=node if states[i % len(states)] == JobState.RUNNING else None,
            started_at=timezone.now() - timedelta(minutes=i),
            estimated_start_at=timezone.now() + timedelta(minutes=i),
        )

    with django_assert_num_queries(6):
        page = html(client.get(reverse("web:job_list")))
    with django_assert_num_queries(6):
        client.get(reverse("web:job_list"), {"mine": "1", "q": "job", "page": "2"}, **HTMX)

    assert len(listed(page)) == 50


# --- the same filters in the API ------------------------------------------------------------


def test_the_api_lists_mine_only_and_searches_by_name(alice: Any, many: dict[str, Job]) -> None:
    api = token_client(alice)

    found = api.get("/api/v1/jobs/", {"mine": "true", "q": "TRAIN"}).json()
    bad = api.get("/api/v1/jobs/", {"mine": "maybe"})

    assert [job["name"] for job in found["results"]] == [
        "gpt-TRAIN",
        "retrain-all",
        "bert-train",
        "Train-ResNet",
    ]
    assert bad.status_code == 400
    assert bad.json() == {"errors": {"mine": "'maybe' is not allowed; allowed: true, false"}}
