"""The server-rendered pages, through Django's test client.

Each page renders for the people who may see it, and 404s (never 403) for a team's outsider;
htmx requests get only the fragment that refreshes; the forms show each error next to its
field and store nothing on error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.jobs.models import Job, JobLogChunk, JobState
from portal.jobs.testing import allocate, make_job, make_node, make_team, make_user
from portal.notify.models import TeamWebhook
from portal.tenants.models import Membership, Team
from portal.web.forms import FormError, job_form_errors

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def vision() -> Team:
    return make_team("vision", weight=2.0, guaranteed_units=2.0, limit_units=3.0)


@pytest.fixture
def nlp() -> Team:
    return make_team("nlp", weight=1.0, guaranteed_units=1.0, limit_units=3.0)


@pytest.fixture
def alice(vision: Team) -> Any:
    return make_user("alice", team=vision)


@pytest.fixture
def vera(vision: Team) -> Any:
    return make_user("vera", team=vision, role=Membership.Role.ADMIN)


@pytest.fixture
def bob(nlp: Team) -> Any:
    return make_user("bob", team=nlp)


@pytest.fixture
def site_admin() -> Any:
    return make_user("admin", site_admin=True)


@pytest.fixture
def node() -> Any:
    return make_node(
        "node-1",
        gpus=[{"mode": "whole"}, {"mode": "mig", "profiles": ["3g.40gb", "1g.10gb"]}],
    )


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def html(response: Any) -> str:
    return response.content.decode()


def submit_form(**changes: str) -> dict[str, str]:
    form = {
        "name": "hello",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": "python -c \"import os; print(os.environ['CUDA_VISIBLE_DEVICES'])\"",
        "env": "SEED=1\nMODE=fast",
        "gpu_kind": "mig",
        "gpu_count": "1",
        "gpu_profile": "1g.10gb",
        "gpu_model": "",
        "priority": "normal",
        "time_limit_s": "600",
        "preemptible": "on",
        "depends_on": "",
    }
    form.update(changes)
    return form


# --- login ---------------------------------------------------------------------------


def test_pages_send_an_anonymous_visitor_to_the_login_page() -> None:
    response = Client().get(reverse("web:job_list"))

    assert response.status_code == 302
    assert response.url == f"{reverse('web:login')}?next=/"


def test_an_htmx_poll_after_logout_sends_the_whole_page_to_the_login_form(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice)
    page = f"http://testserver/jobs/{job.pk}/"

    response = Client().get(
        reverse("web:job_detail", args=[job.pk]), HTTP_HX_CURRENT_URL=page, **HTMX
    )

    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/login/?next=/jobs/{job.pk}/"
    assert response.content == b""


def test_it_logs_in_and_out(alice: Any) -> None:
    client = Client()
    assert "Log in" in html(client.get(reverse("web:login")))

    response = client.post(
        reverse("web:login"), {"username": "alice", "password": "test-password-123"}
    )
    assert response.status_code == 302 and response.url == reverse("web:job_list")
    assert client.get(reverse("web:job_list")).status_code == 200

    response = client.post(reverse("web:logout"))
    assert response.status_code == 302
    assert client.get(reverse("web:job_list")).status_code == 302


def test_a_wrong_password_is_refused_on_the_page(alice: Any) -> None:
    response = Client().post(reverse("web:login"), {"username": "alice", "password": "nope"})

    assert response.status_code == 200
    assert "Please enter a correct username and password" in html(response)


# --- job list ------------------------------------------------------------------------


def test_the_job_list_shows_the_jobs_of_my_teams_only(
    alice: Any, bob: Any, vision: Team, nlp: Team
) -> None:
    make_job(team=vision, user=alice, name="vision-train")
    make_job(team=nlp, user=bob, name="nlp-eval")

    page = html(client_for(alice).get(reverse("web:job_list")))

    assert "vision-train" in page
    assert "nlp-eval" not in page
    assert "<html" in page


def test_the_job_list_filters_by_state_and_team(alice: Any, vision: Team, nlp: Team) -> None:
    Membership.objects.create(team=nlp, user=alice)
    make_job(team=vision, user=alice, name="waiting-one")
    make_job(team=vision, user=alice, name="done-one", state=JobState.SUCCEEDED, exit_code=0)
    make_job(team=nlp, user=alice, name="nlp-one")
    client = client_for(alice)

    by_state = html(client.get(reverse("web:job_list"), {"state": "SUCCEEDED"}))
    by_team = html(client.get(reverse("web:job_list"), {"team": "nlp"}))

    assert "done-one" in by_state and "waiting-one" not in by_state
    assert "nlp-one" in by_team and "waiting-one" not in by_team


def test_an_htmx_poll_of_the_job_list_gets_only_the_table_and_keeps_the_filter(
    alice: Any, vision: Team
) -> None:
    make_job(team=vision, user=alice, name="vision-train")

    response = client_for(alice).get(reverse("web:job_list"), {"state": "PENDING"}, **HTMX)
    fragment = html(response)

    assert "<html" not in fragment
    assert 'id="job-table"' in fragment
    assert 'hx-trigger="every 2s"' in fragment
    assert 'hx-get="/?state=PENDING"' in fragment
    assert "vision-train" in fragment
    assert "HX-Request" in response["Vary"]


def test_the_job_list_costs_the_same_queries_for_one_job_or_many(
    alice: Any, vision: Team, django_assert_max_num_queries: Any
) -> None:
    client = client_for(alice)
    make_job(team=vision, user=alice)
    with django_assert_max_num_queries(50) as one:
        client.get(reverse("web:job_list"), **HTMX)
    for number in range(10):
        make_job(team=vision, user=alice, name=f"job-{number}")
    with django_assert_max_num_queries(50) as many:
        client.get(reverse("web:job_list"), **HTMX)

    assert len(many.captured_queries) == len(one.captured_queries)


# --- job page --------------------------------------------------------------------------


def test_the_job_page_shows_the_slice_the_log_and_the_events(
    alice: Any, vision: Team, node: Any
) -> None:
    job = make_job(
        team=vision,
        user=alice,
        name="mig-run",
        state=JobState.RUNNING,
        gpu_kind="mig",
        gpu_profile="1g.10gb",
        started_at=timezone.now(),
    )
    allocate(job, ["MIG-node-1-1-1"])
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, data="MIG-node-1-1-1\n")

    page = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk])))

    assert "mig-run" in page
    assert 'id="job-state">RUNNING<' in page
    assert "node-1" in page
    assert "1 × MIG 1g.10gb" in page
    assert 'id="job-slices"' in page and "MIG-node-1-1-1" in page and "1g.10gb" in page
    assert '<pre class="log" id="log-' in page and "MIG-node-1-1-1\n</pre>" in page
    assert 'id="job-events"' in page
    assert "Cancel job" in page


def test_the_job_page_shows_the_command_as_it_was_typed(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)
    Job.objects.filter(pk=job.pk).update(
        command=["python", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    )

    page = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk])))

    assert (
        "python -c &quot;import os; print(os.environ[&#x27;CUDA_VISIBLE_DEVICES&#x27;])&quot;"
        in page
    )


def test_a_long_log_shows_its_end_and_points_to_the_whole_log(
    alice: Any, vision: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("portal.web.views.LOG_TAIL_CHARS", 12)
    job = make_job(team=vision, user=alice, state=JobState.RUNNING)
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, data="first line\n")
    JobLogChunk.objects.create(job=job, attempt=1, seq=1, data="latest line\n")

    page = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk])))

    assert "latest line\n</pre>" in page and "first line" not in page
    assert f'href="/api/v1/jobs/{job.pk}/log/"' in page


def test_a_pending_job_shows_the_schedulers_reason_position_and_estimated_start(
    alice: Any, vision: Team
) -> None:
    eta = timezone.now() + timedelta(minutes=30)
    job = make_job(
        team=vision,
        user=alice,
        gpu_count=2,
        pending_code="QUOTA_LIMIT",
        pending_message="team vision uses 2.0 of 3.0 units, job needs 2.0",
        queue_position=3,
        estimated_start_at=eta,
    )

    fragment = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk]), **HTMX))

    assert "QUOTA_LIMIT" in fragment
    assert "team vision uses 2.0 of 3.0 units, job needs 2.0" in fragment
    assert "<dt>Queue position</dt><dd>3</dd>" in fragment
    assert eta.strftime("%Y-%m-%d %H:%M:%S") in fragment
    assert "Start between" not in fragment  # no band stored


def test_a_pending_job_shows_the_band_around_its_estimated_start(alice: Any, vision: Team) -> None:
    eta = timezone.now() + timedelta(minutes=30)
    job = make_job(
        team=vision,
        user=alice,
        pending_code="NO_FIT",
        pending_message="needs 2 x whole, at most 0 free on any node",
        queue_position=1,
        estimated_start_at=eta,
        estimated_start_earliest_at=eta - timedelta(minutes=20),
    )

    fragment = html(client_for(alice).get(reverse("web:job_detail", args=[job.pk]), **HTMX))

    earliest = (eta - timedelta(minutes=20)).strftime("%Y-%m-%d %H:%M")
    assert f"{earliest} and an unknown time (a job ahead has no known end)" in fragment


def test_the_job_fragment_polls_while_the_job_runs_and_stops_once_it_ended(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice, state=JobState.RUNNING)
    client = client_for(alice)
    url = reverse("web:job_detail", args=[job.pk])

    running = html(client.get(url, **HTMX))
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, exit_code=0)
    ended = html(client.get(url, **HTMX))

    assert "<html" not in running and "<html" not in ended
    assert 'hx-trigger="every 1s"' in running
    assert "hx-trigger" not in ended
    assert 'id="job-state">SUCCEEDED<' in ended
    assert "Cancel job" not in ended


def test_a_history_restore_gets_the_whole_page_not_the_fragment(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)

    response = client_for(alice).get(
        reverse("web:job_detail", args=[job.pk]), HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HTMX
    )

    assert "<html" in html(response)


# --- submit ----------------------------------------------------------------------------


def test_the_submit_form_offers_my_teams_and_the_known_mig_profiles(
    alice: Any, vision: Team, nlp: Team, node: Any
) -> None:
    page = html(client_for(alice).get(reverse("web:job_submit")))

    assert '<option value="vision" selected>vision</option>' in page
    assert 'value="nlp"' not in page
    here = page.index('<optgroup label="On this cluster">')
    others = page.index('<optgroup label="Other known profiles">')
    assert here < page.index('<option value="1g.10gb" selected>1g.10gb (0.14 units)') < others
    assert here < page.index('<option value="3g.40gb">3g.40gb (0.43 units)') < others
    assert others < page.index('<option value="7g.80gb">7g.80gb (1 unit)')
    assert '<option value="NVIDIA A100">' in page


def test_a_valid_submit_stores_the_job_and_redirects_to_its_page(alice: Any, vision: Team) -> None:
    response = client_for(alice).post(reverse("web:job_submit"), submit_form())

    job = Job.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("web:job_detail", args=[job.pk])
    assert job.team == vision and job.user == alice and job.state == JobState.PENDING
    assert job.command == ["python", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    assert job.env == {"SEED": "1", "MODE": "fast"}
    assert (job.gpu_kind, job.gpu_count, job.gpu_profile) == ("mig", 1, "1g.10gb")
    assert job.time_limit_s == 600 and job.preemptible


def test_an_unticked_preemptible_box_submits_a_non_preemptible_whole_gpu_job(
    alice: Any, vision: Team
) -> None:
    form = submit_form(gpu_kind="whole", gpu_count="2", gpu_profile="1g.10gb", time_limit_s="")
    del form["preemptible"]

    client_for(alice).post(reverse("web:job_submit"), form)

    job = Job.objects.get()
    assert (job.gpu_kind, job.gpu_count, job.gpu_profile) == ("whole", 2, "")
    assert not job.preemptible and job.time_limit_s is None


def test_a_bad_submit_shows_each_error_next_to_its_field_keeps_the_values_and_stores_nothing(
    alice: Any, vision: Team
) -> None:
    form = submit_form(
        name="",
        image="Not An Image!",
        command="",
        env="NOT A PAIR",
        gpu_count="0",
        time_limit_s="soon",
        priority="urgent",
    )

    response = client_for(alice).post(reverse("web:job_submit"), form)
    page = html(response)

    assert response.status_code == 422
    assert Job.objects.count() == 0
    assert '<span class="error" id="error-name">required' in page
    assert '<span class="error" id="error-image">&#x27;Not An Image!&#x27; is not an image' in page
    assert '<span class="error" id="error-command">required, must not be empty' in page
    assert (
        '<span class="error" id="error-env">line 1 &#x27;NOT A PAIR&#x27; is not KEY=VALUE' in page
    )
    assert '<span class="error" id="error-gpu_count">0 is out of range; allowed:' in page
    assert (
        '<span class="error" id="error-time_limit_s">&#x27;soon&#x27; is not a whole number' in page
    )
    assert '<span class="error" id="error-priority">unknown class &#x27;urgent&#x27;' in page
    # What was typed stays in the form.
    assert 'value="Not An Image!"' in page
    assert ">NOT A PAIR</textarea>" in page


def test_an_unknown_mig_profile_and_an_over_limit_count_name_their_fields(
    alice: Any, vision: Team
) -> None:
    client = client_for(alice)

    profile = html(client.post(reverse("web:job_submit"), submit_form(gpu_profile="9g.99gb")))
    count = html(
        client.post(reverse("web:job_submit"), submit_form(gpu_kind="whole", gpu_count="5"))
    )

    assert (
        '<span class="error" id="error-gpu_profile">unknown MIG profile &#x27;9g.99gb&#x27;; allowed: 1g.5gb'
        in profile
    )
    assert '<span class="error" id="error-gpu_count">over-limit count: 5 x whole GPU' in count
    assert Job.objects.count() == 0


def test_every_problem_is_listed_at_the_top_in_words_not_request_paths(
    alice: Any, vision: Team
) -> None:
    form = submit_form(
        name="",
        command="",
        env="CUDA_VISIBLE_DEVICES=1",
        gpu_kind="whole",
        gpu_count="0",
        depends_on="abc, 7:sometimes",
    )

    page = html(client_for(alice).post(reverse("web:job_submit"), form))
    summary = page.split('id="form-problems"', 1)[1].split("</div>", 1)[0]

    assert "6 problems to fix" in summary
    assert '<a href="#id_name">Name</a>: required' in summary
    assert '<a href="#id_command">Command</a>: required, must not be empty' in summary
    assert '<a href="#id_env">Environment</a>: CUDA_VISIBLE_DEVICES is reserved' in summary
    assert '<a href="#id_gpu_count">GPU count</a>: 0 is out of range' in summary
    assert (
        '<a href="#id_depends_on">Depends on</a>: dependency 1: &#x27;abc&#x27; is not a whole'
        in summary
    )
    # Two problems with one input: both next to it, one per line, each saying which entry.
    assert (
        '<span class="error" id="error-depends_on">dependency 1: &#x27;abc&#x27; is not a whole '
        "number; allowed: a job id &gt;= 1<br>dependency 2: unknown kind &#x27;sometimes&#x27;"
        in page
    )
    for path in ("depends_on.", "0.job", "1.kind", "env.CUDA", "gpu.count"):
        assert path not in page
    assert Job.objects.count() == 0


def test_a_hidden_input_is_not_sent_so_it_cannot_hold_an_invisible_error(
    alice: Any, vision: Team
) -> None:
    # The model input is hidden for an MPS request; what it still holds is left out.
    response = client_for(alice).post(
        reverse("web:job_submit"), submit_form(gpu_kind="mps", gpu_model="a100")
    )

    job = Job.objects.get()
    assert response.status_code == 302
    assert (job.gpu_kind, job.gpu_model) == ("mps", "")


def test_an_error_no_input_shows_is_named_in_words() -> None:
    by_input, problems = job_form_errors(
        {"gpu.min_count": "must not be above count", "name": "required"}
    )

    assert by_input == {"name": ["required"]}
    assert problems == [
        FormError(label="Name", message="required", input="name"),
        FormError(label="GPU request, min count", message="must not be above count", input=None),
    ]


def test_a_team_i_am_not_in_is_refused_on_the_form(alice: Any, nlp: Team) -> None:
    page = html(client_for(alice).post(reverse("web:job_submit"), submit_form(team="nlp")))

    assert (
        '<span class="error" id="error-team">&#x27;nlp&#x27; is not one of your teams; allowed: vision'
        in page
    )
    assert Job.objects.count() == 0


def test_a_user_without_a_team_is_told_so_on_the_form(site_admin: Any) -> None:
    page = html(client_for(site_admin).get(reverse("web:job_submit")))

    assert "You are not a member of any team" in page


# --- cancel ----------------------------------------------------------------------------


def test_cancel_on_the_page_cancels_a_pending_job_and_the_fragment_stops_polling(
    alice: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice)

    response = client_for(alice).post(reverse("web:job_cancel", args=[job.pk]), **HTMX)
    fragment = html(response)

    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert "<html" not in fragment
    assert 'id="job-state">CANCELLED<' in fragment
    assert "hx-trigger" not in fragment


def test_cancel_of_a_running_job_asks_its_agent_to_stop_it(
    alice: Any, vision: Team, node: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = make_job(team=vision, user=alice, state=JobState.RUNNING)
    allocate(job, ["GPU-node-1-0"])

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        fragment = html(client_for(alice).post(reverse("web:job_cancel", args=[job.pk]), **HTMX))

    job.refresh_from_db()
    assert job.stop_reason == "cancel" and job.stop_requested_at is not None
    assert len(callbacks) == 1  # the stop message, sent after commit
    assert "Stopping (cancel requested)" in fragment
    assert "Cancel job" not in fragment
    assert 'hx-trigger="every 1s"' in fragment


def test_cancel_without_htmx_redirects_back_to_the_job_page(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)

    response = client_for(alice).post(reverse("web:job_cancel", args=[job.pk]))

    assert response.status_code == 302
    assert response.url == reverse("web:job_detail", args=[job.pk])
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_cancel_of_a_finished_job_says_why_on_the_page(alice: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice, state=JobState.SUCCEEDED, exit_code=0)

    fragment = html(client_for(alice).post(reverse("web:job_cancel", args=[job.pk]), **HTMX))

    assert f"job {job.pk} already ended (SUCCEEDED); nothing to cancel" in fragment
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


def test_a_team_mate_may_not_cancel_someone_elses_job(alice: Any, vision: Team) -> None:
    carl = make_user("carl", team=vision)
    job = make_job(team=vision, user=alice)
    client = client_for(carl)

    page = html(client.get(reverse("web:job_detail", args=[job.pk])))
    response = client.post(reverse("web:job_cancel", args=[job.pk]), **HTMX)

    assert "Cancel job" not in page
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_a_team_admin_may_cancel_a_members_job(alice: Any, vera: Any, vision: Team) -> None:
    job = make_job(team=vision, user=alice)

    client_for(vera).post(reverse("web:job_cancel", args=[job.pk]), **HTMX)

    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


# --- isolation -------------------------------------------------------------------------


def test_an_nlp_member_gets_404_for_a_vision_job_and_the_vision_team(
    alice: Any, bob: Any, vision: Team
) -> None:
    job = make_job(team=vision, user=alice)
    client = client_for(bob)

    assert client.get(reverse("web:job_detail", args=[job.pk])).status_code == 404
    assert client.get(reverse("web:job_detail", args=[job.pk]), **HTMX).status_code == 404
    assert client.post(reverse("web:job_cancel", args=[job.pk])).status_code == 404
    assert client.get(reverse("web:team_detail", args=["vision"])).status_code == 404
    assert client.post(reverse("web:team_quota", args=["vision"]), {}).status_code == 404
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_a_missing_job_is_a_404_like_a_foreign_one(alice: Any) -> None:
    assert client_for(alice).get(reverse("web:job_detail", args=[999])).status_code == 404


# --- teams -----------------------------------------------------------------------------


def test_the_teams_index_lists_my_teams_and_every_team_for_a_site_admin(
    alice: Any, site_admin: Any, vision: Team, nlp: Team
) -> None:
    mine = html(client_for(alice).get(reverse("web:team_list")))
    every = html(client_for(site_admin).get(reverse("web:team_list")))

    assert 'href="/teams/vision/"' in mine and 'href="/teams/nlp/"' not in mine
    assert 'href="/teams/vision/"' in every and 'href="/teams/nlp/"' in every


def test_the_team_page_shows_quota_use_and_members(
    alice: Any, vera: Any, vision: Team, node: Any
) -> None:
    running = make_job(team=vision, user=alice, state=JobState.RUNNING)
    allocate(running, ["GPU-node-1-0", "MIG-node-1-1-0"])  # 1 + 3/7 units
    make_job(team=vision, user=alice)

    page = html(client_for(alice).get(reverse("web:team_detail", args=["vision"])))

    assert '<div class="value">1.43 <span class="unit">units</span></div>' in page  # in use
    assert '<div class="label">Guaranteed</div><div class="value">2 <span' in page
    assert '<div class="label">Limit</div><div class="value">3 <span' in page
    assert '<div class="label">Fair-share weight</div><div class="value">2</div>' in page
    assert '<div class="label">Running jobs</div><div class="value">1</div>' in page
    assert '<div class="label">Pending jobs</div><div class="value">1</div>' in page
    assert '<td data-label="User">alice <span class="muted">(you)</span></td>' in page
    assert '<td data-label="Role">\n          member' in page
    assert '<td data-label="User">vera</td>' in page
    assert '<td data-label="Role">\n          <span class="tag">team admin</span>' in page


def test_a_team_admin_sees_the_quota_read_only(vera: Any, vision: Team) -> None:
    page = html(client_for(vera).get(reverse("web:team_detail", args=["vision"])))

    assert "you are team admin" in page
    assert "Edit quota" not in page and 'name="weight"' not in page


def test_a_site_admin_sees_the_quota_form_with_the_current_values(
    site_admin: Any, vision: Team
) -> None:
    page = html(client_for(site_admin).get(reverse("web:team_detail", args=["vision"])))

    assert "Edit quota" in page
    assert 'hx-post="/teams/vision/quota/"' in page
    assert 'name="weight" value="2"' in page
    assert 'name="limit_units" value="3"' in page


def test_a_site_admin_edits_the_quota_through_htmx(site_admin: Any, vision: Team) -> None:
    response = client_for(site_admin).post(
        reverse("web:team_quota", args=["vision"]),
        {"weight": "3", "guaranteed_units": "1.5", "limit_units": "", "max_priority": "high"},
        **HTMX,
    )
    fragment = html(response)

    vision.refresh_from_db()
    assert response.status_code == 200
    assert (vision.weight, vision.guaranteed_units, vision.limit_units) == (3.0, 1.5, None)
    assert vision.max_priority == "high"
    assert "<html" not in fragment and 'id="team-quota"' in fragment
    assert "Saved." in fragment
    assert '<div class="label">Limit</div><div class="value">none</div>' in fragment


def test_a_bad_quota_shows_the_error_next_to_its_field_and_saves_nothing(
    site_admin: Any, vision: Team
) -> None:
    client = client_for(site_admin)
    url = reverse("web:team_quota", args=["vision"])

    below = client.post(
        url,
        {"weight": "2", "guaranteed_units": "5", "limit_units": "3", "max_priority": "normal"},
        **HTMX,
    )
    not_a_number = client.post(
        url,
        {"weight": "lots", "guaranteed_units": "2", "limit_units": "3", "max_priority": "normal"},
        **HTMX,
    )

    vision.refresh_from_db()
    assert below.status_code == 422 and not_a_number.status_code == 422
    assert (
        '<span class="error" id="error-limit_units">the limit (3) must not be below the guarantee (5)'
        in html(below)
    )
    assert 'name="guaranteed_units" value="5"' in html(below)  # the typed value stays
    assert '<span class="error" id="error-weight">&#x27;lots&#x27; is not a number' in html(
        not_a_number
    )
    assert (vision.weight, vision.guaranteed_units, vision.limit_units) == (2.0, 2.0, 3.0)


def test_a_team_admin_may_not_edit_the_quota(vera: Any, vision: Team) -> None:
    response = client_for(vera).post(
        reverse("web:team_quota", args=["vision"]),
        {"weight": "9", "guaranteed_units": "3", "limit_units": "3", "max_priority": "high"},
        **HTMX,
    )

    vision.refresh_from_db()
    assert response.status_code == 403
    assert vision.weight == 2.0 and vision.max_priority == "normal"


# --- notifications page ----------------------------------------------------------------


def test_the_notifications_page_shows_every_teams_webhook_in_the_same_queries(
    site_admin: Any, vision: Team, nlp: Team, django_assert_max_num_queries: Any
) -> None:
    client = client_for(site_admin)
    TeamWebhook.objects.create(team=vision, url="https://hooks.example.org/vision", secret="s1")
    with django_assert_max_num_queries(50) as two:
        first = client.get(reverse("web:notifications"))
    for number in range(5):
        team = make_team(f"team-{number}")
        TeamWebhook.objects.create(team=team, url=f"https://hooks.example.org/{number}", secret="s")
    with django_assert_max_num_queries(50) as seven:
        again = client.get(reverse("web:notifications"))

    assert len(seven.captured_queries) == len(two.captured_queries)
    assert 'value="https://hooks.example.org/vision"' in html(first)
    assert 'id="id_team_url_nlp" name="url" value=""' in html(first)  # nlp has no webhook
    assert 'value="https://hooks.example.org/4"' in html(again)
