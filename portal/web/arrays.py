"""A job array's page: its members by state, a table of them, and the actions on all of them
(cancel every member that can be, resubmit the failed ones) for those who may act
(``portal.jobs.arrays``). While a member can still change, the page's live part polls
itself, as a job's page does; an action answers with that part (htmx) or a redirect back
to the page with the outcome as a message (no JavaScript).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.jobs.arrays import (
    RESUBMIT_STATES,
    array_cancel,
    array_get_for_user,
    array_resubmit_failed,
    array_view,
)
from portal.jobs.models import JobArray
from portal.jobs.services import job_actions_for, job_actor
from portal.jobs.validation import JobRequestError
from portal.web.pages import login_required, page_number, page_problem, refused, render_page

MEMBERS_PER_PAGE = 100


def _array_for(request: HttpRequest, array_id: int) -> JobArray:
    """The array if the user may see it; 404 for a missing one and another team's alike."""
    try:
        return array_get_for_user(user=request.user, array_id=array_id)
    except JobArray.DoesNotExist:
        raise Http404("no such job array") from None


def _array_context(request: HttpRequest, array: JobArray) -> dict[str, Any]:
    view = array_view(array=array)
    actor = job_actor(user=request.user)
    members = view.members
    paginator = Paginator(members, MEMBERS_PER_PAGE)
    # A page beyond the end shows the last one; one that is no number, the first (and a 400).
    page = paginator.page(min(page_number(request) or 1, paginator.num_pages))
    return {
        "nav": "jobs",
        "array": array,
        "view": view,
        "names": view.names,
        "counts": [(state, count) for state, count in view.counts.items() if count],
        "page": page,
        "rows": [{"job": job, "values": view.values_of(job)} for job in page.object_list],
        "ended": all(job.is_terminal for job in members),
        "can_cancel": any(job_actions_for(job=job, actor=actor).cancel for job in members),
        "can_resubmit": any(job.state in RESUBMIT_STATES and actor.may_act(job) for job in members),
    }


@login_required
def array_detail(request: HttpRequest, array_id: int) -> HttpResponse:
    array = _array_for(request, array_id)
    context = _array_context(request, array)
    problem = page_problem(request)
    context["problem"] = f"Page: {problem}" if problem else ""
    status = 400 if problem else 200
    return render_page(request, "web/array_detail.html", "array_live", context, status=status)


@login_required
@require_POST
def array_cancel_view(request: HttpRequest, array_id: int) -> HttpResponse:
    def cancel(array: JobArray) -> str:
        cancelled = array_cancel(array=array, user=request.user)
        return f"Cancel of {len(cancelled)} job(s) of array {array.pk} requested."

    return _act(request, array_id, cancel)


@login_required
@require_POST
def array_resubmit_failed_view(request: HttpRequest, array_id: int) -> HttpResponse:
    def resubmit(array: JobArray) -> str:
        done = array_resubmit_failed(array=array, user=request.user)
        return f"{len(done)} failed job(s) of array {array.pk} resubmitted."

    return _act(request, array_id, resubmit)


def _act(request: HttpRequest, array_id: int, action: Callable[[JobArray], str]) -> HttpResponse:
    array = _array_for(request, array_id)  # 404 for an array the user may not see
    try:
        done = action(array)  # PermissionDenied (403) for one they may not act on
    except JobRequestError as error:
        # A resubmit checks each request again: the team's limits may have changed since.
        return _refused(request, array, f"Not resubmitted: {error}")
    if not request.htmx:
        messages.success(request, done)
        return redirect(reverse("web:array_detail", args=[array.pk]))
    return render(request, "web/array_detail.html#array_live", _array_context(request, array))


def _refused(request: HttpRequest, array: JobArray, message: str) -> HttpResponse:
    if not request.htmx:
        messages.error(request, message)
        return redirect(reverse("web:array_detail", args=[array.pk]))
    return refused(message, box="#array-action-message")
