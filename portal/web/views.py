"""The server-rendered pages: thin function views over the services and selectors.

A page that refreshes itself renders, for an htmx request, only the fragment that changes
(``template.html#partial``, django-template-partials), so the poll never ships the whole page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from portal.cluster.capacity import guarantee_overcommit
from portal.cluster.models import Gpu, Slice
from portal.jobs.models import HOLDING_STATES, Job, JobState
from portal.jobs.selectors import (
    job_get_for_user,
    job_list_for_user,
    job_log,
    job_slices,
    team_overview,
    team_overviews,
)
from portal.jobs.services import (
    JobActionError,
    job_actions_for,
    job_actor,
    job_request_of,
    job_resubmit,
    job_submit,
)
from portal.jobs.validation import JobRequestError, validate_job_request
from portal.scheduling.selectors import job_priority
from portal.tenants.models import (
    PRIORITY_CLASSES,
    TOKEN_NAME_MAX_CHARS,
    TOKEN_SCOPES,
    ApiToken,
    Team,
)
from portal.tenants.selectors import is_site_admin, member_teams, teams_for_user
from portal.tenants.services import QuotaError, quota_update
from portal.tenants.tokens import (
    TokenError,
    token_create,
    token_list_for_user,
    token_problems,
    token_revoke,
)
from portal.web.forms import (
    FormError,
    job_form_errors,
    job_form_values,
    job_form_values_of,
    job_request_data,
    quota_form_values,
)
from portal.web.job_gpu import job_gpu_context
from portal.web.pages import (
    UNPROCESSABLE,
    login_required,
    page_number,
    page_problem,
    render_page,
)
from portal.web.team_members import team_members_context
from portal.web.team_usage import page_report, usage_context
from scheduler.units import MIG_PROFILES

# How many jobs one page of the list shows; the filters narrow it down.
JOB_LIST_PAGE_SIZE = 50
# The job page shows the end of a long log; the API serves all of it.
LOG_TAIL_CHARS = 256 * 1024


# --- jobs ----------------------------------------------------------------------------


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    teams = list(teams_for_user(user=request.user))
    filters, problems = _job_list_filters(request, teams)
    context: dict[str, Any] = {
        "nav": "jobs",
        "states": JobState.values,
        "teams": teams,
        "problems": problems,
        "now": timezone.now(),
        **filters,
    }
    if problems:
        page = Paginator(Job.objects.none(), JOB_LIST_PAGE_SIZE).page(1)
        context.update(rows=[], page=page, query="", list_url=reverse("web:job_list"))
        return render(request, "web/job_list.html", context, status=400)
    jobs = job_list_for_user(
        user=request.user,
        state=filters["state"] or None,
        team=filters["team"] or None,
        mine=bool(filters["mine"]),
        name_contains=filters["q"],
    )
    paginator = Paginator(jobs, JOB_LIST_PAGE_SIZE)
    # A page beyond the end (the list shrank while it was open) shows the last one.
    page = paginator.page(min(page_number(request) or 1, paginator.num_pages))
    query = _job_list_query(filters, page.number)
    context.update(
        rows=job_rows(jobs=page.object_list, user=request.user),
        page=page,
        query=query,
        list_url=_job_list_url(query),
        newer_url=_job_list_url(_job_list_query(filters, page.number - 1))
        if page.has_previous()
        else "",
        older_url=_job_list_url(_job_list_query(filters, page.number + 1))
        if page.has_next()
        else "",
    )
    return render_page(request, "web/job_list.html", "job_table", context)


def _job_list_filters(
    request: HttpRequest, teams: list[Team]
) -> tuple[dict[str, str], list[FormError]]:
    """The list's filters as text (empty: not filtered), and what is wrong with them.

    An unknown state or team (a bookmark of a team one has left) just does not filter."""
    state = request.GET.get("state", "")
    team = request.GET.get("team", "")
    mine = request.GET.get("mine", "")
    search = request.GET.get("q", "").strip()
    problems = []
    if mine not in ("", "1"):
        problems.append(
            FormError(
                label="Mine only",
                message=f"{mine!r} is not allowed; allowed: 1 (only my jobs) or nothing",
                input="mine",
            )
        )
    if "\x00" in search:
        problems.append(
            FormError(label="Name", message="must not contain a NUL character", input="q")
        )
        search = ""
    if problem := page_problem(request):
        problems.append(FormError(label="Page", message=problem, input=None))
    filters = {
        "state": state if state in JobState.values else "",
        "team": team if team in {t.name for t in teams} else "",
        "mine": "1" if mine == "1" else "",
        "q": search,
    }
    return filters, problems


def _job_list_query(filters: dict[str, str], page: int) -> str:
    """The list's address query: its filters (the set ones), and the page after the first."""
    params = {name: value for name, value in filters.items() if value}
    if page > 1:
        params["page"] = str(page)
    return urlencode(params)


def _job_list_url(query: str) -> str:
    return f"{reverse('web:job_list')}?{query}" if query else reverse("web:job_list")


def job_rows(*, jobs: Iterable[Job], user: Any) -> list[dict[str, Any]]:
    """Jobs with the actions ``user`` may take on each: one query for all of them."""
    actor = job_actor(user=user)
    return [{"job": job, "actions": job_actions_for(job=job, actor=actor)} for job in jobs]


@login_required
@require_http_methods(["GET", "POST"])
def job_submit_view(request: HttpRequest) -> HttpResponse:
    teams = list(member_teams(user=request.user).order_by("name"))
    values = job_form_values(request.POST if request.method == "POST" else None)
    source, problems = _job_to_copy(request)
    if request.method == "GET" and source is not None:
        values = job_form_values_of(job_request_of(source))
    elif request.method == "GET" and len(teams) == 1:
        values["team"] = teams[0].name
    resubmit = (
        source is not None
        and job_actions_for(job=source, actor=job_actor(user=request.user)).resubmit
    )
    errors: dict[str, list[str]] = {}
    if request.method == "POST" and not problems:
        try:
            job_request = validate_job_request(job_request_data(values), user=request.user)
            if source is not None:
                # Only a job the user may resubmit puts its id in the form (see the template).
                job = job_resubmit(job=source, user=request.user, request=job_request)
            else:
                job = job_submit(user=request.user, request=job_request)
        except JobRequestError as error:
            errors, problems = job_form_errors(error.errors)
        except JobActionError as error:
            problems = [FormError(label="Resubmit", message=str(error), input=None)]
        else:
            messages.success(request, f"Job {job.pk} submitted.")
            return redirect("web:job_detail", job_id=job.pk)
    profiles_here, models_here = _cluster_offer()
    context = {
        "nav": "submit",
        "values": values,
        "errors": errors,
        "problems": problems,
        "teams": teams,
        "priorities": PRIORITY_CLASSES,
        "mig_profiles": _mig_profile_choices(profiles_here),
        "gpu_models": models_here,
        "source": source,
        "resubmit": resubmit,
    }
    status = 200
    if problems:
        status = 400 if request.method == "GET" else UNPROCESSABLE
    return render(request, "web/job_submit.html", context, status=status)


def _job_to_copy(request: HttpRequest) -> tuple[Job | None, list[FormError]]:
    """The job whose request the form starts from (``?from=<id>``; on POST the form's own
    ``from``, sent only for a resubmit), and what is wrong with ``from``.

    Any job the user may see can be copied; another team's is a 404 like a missing one."""
    raw = (request.POST if request.method == "POST" else request.GET).get("from", "").strip()
    if not raw:
        return None, []
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        message = f"{raw!r} is not a job id; allowed: the id of a job of your teams"
        return None, [FormError(label="Copy of job", message=message, input=None)]
    return _job_for(request, int(raw)), []


def _cluster_offer() -> tuple[set[str], list[str]]:
    """MIG profiles and GPU models this cluster has now, to put them first in the form."""
    profiles = set(
        Slice.objects.filter(kind=Slice.Kind.MIG, present=True)
        .values_list("profile", flat=True)
        .distinct()
    )
    models = sorted(
        set(
            Gpu.objects.filter(present=True)
            .exclude(model="")
            .values_list("model", flat=True)
            .distinct()
        )
    )
    return profiles, models


def _mig_profile_choices(here: set[str]) -> list[dict[str, Any]]:
    """Every known MIG profile, smallest first, in two groups: on this cluster now, and not."""
    ordered = sorted(MIG_PROFILES.values(), key=lambda p: (p.compute_slices, p.memory_gb, p.name))
    groups = [
        ("On this cluster", [p for p in ordered if p.name in here]),
        ("Other known profiles", [p for p in ordered if p.name not in here]),
    ]
    return [
        {"label": label, "profiles": [{"name": p.name, "units": p.units} for p in profiles]}
        for label, profiles in groups
        if profiles
    ]


def _job_for(request: HttpRequest, job_id: int) -> Job:
    """The job if the user may see it; 404 for a missing job and for another team's alike."""
    try:
        return job_get_for_user(user=request.user, job_id=job_id)
    except Job.DoesNotExist:
        raise Http404("no such job") from None


def _job_context(request: HttpRequest, job: Job, **extra: Any) -> dict[str, Any]:
    log = job_log(job=job)
    truncated = len(log) > LOG_TAIL_CHARS
    stopping = job.stop_requested_at is not None and job.state in HOLDING_STATES
    return {
        "nav": "jobs",
        "job": job,
        "slices": job_slices(job=job),
        "events": list(job.events.all()),
        "log": log[-LOG_TAIL_CHARS:] if truncated else log,
        "log_truncated": truncated,
        "actions": job_actions_for(job=job, actor=job_actor(user=request.user)),
        "stopping": stopping,
        # Its place in the queue, in parts, from the latest pass (pending jobs only).
        "priority": job_priority(job=job),
        # Run time, GPU-unit-hours, GPU use over time, a failure's last log lines.
        **job_gpu_context(job=job, log=log, now=timezone.now()),
        **extra,
    }


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_for(request, job_id)
    return render_page(request, "web/job_detail.html", "job_live", _job_context(request, job))


# --- teams ---------------------------------------------------------------------------


def _team_for(request: HttpRequest, name: str) -> Team:
    """The team if the user may see it (member or site admin); 404 otherwise, like the API."""
    try:
        return teams_for_user(user=request.user).get(name=name)
    except Team.DoesNotExist:
        raise Http404("no such team") from None


def _my_role(overview: dict[str, Any], username: str) -> str:
    for member in overview["members"]:
        if member["username"] == username:
            return str(member["role"])
    return ""


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    overviews = team_overviews(teams=teams_for_user(user=request.user).order_by("name"))
    username = request.user.get_username()
    rows = [{**overview, "my_role": _my_role(overview, username)} for overview in overviews]
    return render(request, "web/team_list.html", {"nav": "teams", "teams": rows})


def _team_context(request: HttpRequest, team: Team, **extra: Any) -> dict[str, Any]:
    overview = team_overview(team=team)
    return {
        "nav": "teams",
        "team": team,
        "overview": overview,
        "my_role": _my_role(overview, request.user.get_username()),
        "can_edit_quota": is_site_admin(request.user),
        "priorities": PRIORITY_CLASSES,
        "values": quota_form_values(None, overview),
        "errors": {},
        # A warning, not a block: a site admin may promise more than the cluster holds.
        "overcommit": guarantee_overcommit() if is_site_admin(request.user) else None,
        **team_members_context(request=request, team=team),
        **extra,
    }


@login_required
def team_detail(request: HttpRequest, name: str) -> HttpResponse:
    team = _team_for(request, name)
    usage = usage_context(page_report(team=team, viewer=request.user))
    return render(request, "web/team_detail.html", _team_context(request, team, usage=usage))


@login_required
@require_POST
def team_quota(request: HttpRequest, name: str) -> HttpResponse:
    team = _team_for(request, name)
    values = quota_form_values(request.POST, {})
    try:
        # quota_update refuses anyone but a site admin (PermissionDenied: a 403).
        team = quota_update(team=team, by=request.user, **values)
    except QuotaError as error:
        context = _team_context(request, team, values=values, errors=error.errors)
        return render_page(request, "web/team_detail.html", "quota", context, status=UNPROCESSABLE)
    if not request.htmx:
        messages.success(request, f"Quota of team {team.name} saved.")
        return redirect("web:team_detail", name=team.name)
    return render(request, "web/team_detail.html#quota", _team_context(request, team, saved=True))


# --- tokens --------------------------------------------------------------------------

# The expiry a person picks on the Tokens page (the API takes any time: expires_at).
TOKEN_EXPIRY_DAYS = {"": None, "7": 7, "30": 30, "90": 90, "365": 365}
TOKEN_FORM_DEFAULTS = {"name": "", "scopes": ["read", "submit"], "expires_in_days": "30"}


def _tokens_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        "nav": "tokens",
        "tokens": list(token_list_for_user(user=request.user)),
        "now": timezone.now(),
        "scopes": TOKEN_SCOPES,
        "name_max": TOKEN_NAME_MAX_CHARS,
        "expiry_days": [days for days in TOKEN_EXPIRY_DAYS if days],
        "values": TOKEN_FORM_DEFAULTS,
        "errors": {},
        **extra,
    }


@never_cache  # the answer to a create carries the key: no cache may keep it
@login_required
@require_http_methods(["GET", "POST"])
def token_list_view(request: HttpRequest) -> HttpResponse:
    """The user's tokens, and the form that creates one (its key shown in the answer only)."""
    if request.method == "GET":
        return render(request, "web/token_list.html", _tokens_context(request))
    values = {
        "name": request.POST.get("name", ""),
        "scopes": request.POST.getlist("scopes"),
        "expires_in_days": request.POST.get("expires_in_days", ""),
    }
    days = TOKEN_EXPIRY_DAYS.get(values["expires_in_days"], -1)
    now = timezone.now()
    try:
        if days == -1:
            allowed = ", ".join(f"{d} days" for d in TOKEN_EXPIRY_DAYS if d)
            others = token_problems(
                name=values["name"], scopes=values["scopes"], expires_at=None, now=now
            )
            raise TokenError({**others, "expires_at": f"unknown choice; allowed: never, {allowed}"})
        token, key = token_create(
            user=request.user,
            name=values["name"],
            scopes=values["scopes"],
            expires_at=now + timedelta(days=days) if days else None,
            now=now,
        )
    except TokenError as error:
        context = _tokens_context(request, values=values, errors=error.errors)
        return render_page(request, "web/token_list.html", "tokens", context, status=UNPROCESSABLE)
    context = _tokens_context(request, created=token, key=key)
    return render_page(request, "web/token_list.html", "tokens", context, status=201)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the user's tokens; someone else's is a 404, like a missing one."""
    try:
        token_revoke(user=request.user, token_id=token_id)
    except ApiToken.DoesNotExist:
        raise Http404("no such token") from None
    if not request.htmx:
        messages.success(request, "Token revoked: it no longer works.")
        return redirect("web:token_list")
    return render(request, "web/token_list.html#tokens", _tokens_context(request, revoked=True))
