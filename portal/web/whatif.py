"""The submit form's live what-if (``POST /jobs/new/what-if/``): what the scheduler would do
with the request now, shown next to the GPU request and asked again (htmx) as it changes.

The answer is ``portal.scheduling.whatif.what_if``: the real pass on the current snapshot plus
this job, nothing written. The request goes through the submit's own validation first; the
form's parts the scheduler never reads (name, image, command, environment) get stand-ins
while they are still empty or wrong, so the prediction shows before the form is complete,
and only problems with what the scheduler reads are shown here (the submit shows the rest).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from portal.jobs.validation import JobRequest, JobRequestError, validate_job_request
from portal.scheduling.whatif import what_if
from portal.web.forms import job_form_errors, job_form_values, job_request_data
from portal.web.pages import login_required
from scheduler.model import GpuRequest, SliceKind

# The request's parts the scheduler reads: a problem with one of them leaves no prediction.
SCHEDULED_FIELDS = ("team", "gpu", "priority", "time_limit_s", "preemptible", "depends_on")
# Stand-ins for the other parts while they are missing or wrong (nothing is ever stored).
_STAND_INS = {
    "name": "what-if",
    "image": "python:3.11-slim",
    "command": "true",
    "env": "",
}


@login_required
@require_POST
def job_whatif_view(request: HttpRequest) -> HttpResponse:
    values = job_form_values(request.POST)
    context: dict[str, Any] = {}
    try:
        job_request = _checked(job_request_data(values), user=request.user)
    except JobRequestError as error:
        context["problems"] = job_form_errors(error.errors)[1]
    else:
        answer = what_if(request=job_request, user=request.user)
        context.update(whatif=answer, what=slice_words(answer.request), team=job_request.team)
    return render(request, "web/_job_whatif.html", context)


def _checked(data: dict[str, Any], *, user: Any) -> JobRequest:
    """The submit's validation; problems only with parts the scheduler does not read are
    set aside by trying once more with stand-ins for those parts. Parts still empty get
    their stand-ins at once (the usual case while the form is filled in), so the check
    against the cluster, the costly part on a big cluster, runs once."""
    data = {**data, **{name: value for name, value in _STAND_INS.items() if not data.get(name)}}
    try:
        return validate_job_request(data, user=user)
    except JobRequestError as error:
        heads = {name.split(".")[0] for name in error.errors}
        scheduled = {name: m for name, m in error.errors.items() if _scheduled(name)}
        if scheduled or not heads <= set(_STAND_INS):
            raise JobRequestError(scheduled or error.errors) from None
        return validate_job_request({**data, **{h: _STAND_INS[h] for h in heads}}, user=user)


def _scheduled(name: str) -> bool:
    return name.split(".")[0] in SCHEDULED_FIELDS


def slice_words(gpu: GpuRequest) -> str:
    """What one slice of the request is, in the plural: ``whole NVIDIA A100-SXM4-80GB GPUs``,
    ``MIG 1g.10gb instances``, ``MPS shares``."""
    if gpu.kind is SliceKind.MIG:
        return f"MIG {gpu.profile} instances"
    if gpu.kind is SliceKind.MPS:
        return "MPS shares"
    return f"whole {gpu.model} GPUs" if gpu.model else "whole GPUs"
