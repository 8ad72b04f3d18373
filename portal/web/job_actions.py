"""Cancel, hold and release on the pages: from a job's page or from its row in the job list.

Each is a POST (with the CSRF token) to one of the job services, which decide who may and
in which state. The answer depends on where the button was:

- htmx from a row of the list (``HX-Target: job-row-<id>``): that row again, in its new state;
- htmx from the job's page: the page's live part (``job_detail.html#job_live``);
- no JavaScript: a redirect back (the list, with its filters, or the job's page), with the
  outcome as a message.

A state that does not allow the action (holding a running job) answers 409 with the
service's message, which htmx puts in the page's message box (``#job-action-message``,
outside the part that polls, so it stays); someone who may not act gets 403, a job of
another team 404, and nothing changes. Resubmit is not here: it opens the submit form filled
with the job's request (``/jobs/new/?from=<id>``, in ``views.job_submit_view``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from portal.jobs.models import Job
from portal.jobs.selectors import job_get_for_user
from portal.jobs.services import JobActionError, job_cancel, job_hold, job_release
from portal.web.pages import login_required, refused
from portal.web.views import _job_context, _job_for, job_rows

JobService = Callable[..., Job]


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    return _act(request, job_id, job_cancel, done="Cancel of job {pk} requested.")


@login_required
@require_POST
def job_hold_view(request: HttpRequest, job_id: int) -> HttpResponse:
    return _act(request, job_id, job_hold, done="Job {pk} held: it waits until you release it.")


@login_required
@require_POST
def job_release_view(request: HttpRequest, job_id: int) -> HttpResponse:
    return _act(
        request, job_id, job_release, done="Job {pk} released: it is back in the queue, at its end."
    )


def _act(request: HttpRequest, job_id: int, service: JobService, *, done: str) -> HttpResponse:
    job = _job_for(request, job_id)  # 404 for a job the user may not see
    try:
        service(job=job, user=request.user)  # PermissionDenied (403) for one they may not act on
    except JobActionError as error:
        return _refused(request, job, str(error))
    if not request.htmx:
        messages.success(request, done.format(pk=job.pk))
        return redirect(_back(request, job))
    if request.htmx.target == f"job-row-{job.pk}":
        return _row(request, job.pk)
    job = job_get_for_user(user=request.user, job_id=job.pk)
    return render(request, "web/job_detail.html#job_live", _job_context(request, job))


def _refused(request: HttpRequest, job: Job, message: str) -> HttpResponse:
    if not request.htmx:
        messages.error(request, message)
        return redirect(_back(request, job))
    # Into the page's message box, not the row or the live part (the next poll would wipe it).
    return refused(message, box="#job-action-message")


def _row(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_get_for_user(user=request.user, job_id=job_id)
    context: dict[str, Any] = {
        "row": job_rows(jobs=[job], user=request.user)[0],
        "now": timezone.now(),
        "list_url": _safe_next(request) or reverse("web:job_list"),
    }
    return render(request, "web/job_list.html#job_row", context)


def _back(request: HttpRequest, job: Job) -> str:
    """Where a form without JavaScript returns: the page it was sent from (its ``next``)."""
    return _safe_next(request) or reverse("web:job_detail", args=[job.pk])


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return ""
