"""What the pages' forms send, turned into what the services take, and their errors back.

No validation lives here: ``validate_job_request`` and ``quota_update`` check the values and
name what is allowed. This module only maps form field names to the request's dotted names
and back, so each error shows next to the input it is about, and once more, under the
input's label, in the list of every problem at the top of the form (never as a request path
like ``depends_on.1.kind``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.http import QueryDict

from portal.tenants.audit import audit_text
from portal.web.templatetags.portal_web import shell_join

# Submit form: input name -> default shown on an empty form.
JOB_FORM_DEFAULTS: dict[str, str] = {
    "name": "",
    "team": "",
    "image": "python:3.11-slim",
    "command": "",
    "env": "",
    "gpu_kind": "whole",
    "gpu_count": "1",
    "gpu_profile": "1g.10gb",
    "gpu_model": "",
    "priority": "normal",
    "time_limit_s": "",
    "preemptible": "on",
    "depends_on": "",
    # Parts of a GPU request only the API sets; a resubmit on the form keeps them (hidden).
    "gpu_min_count": "",
    "gpu_multi_node": "",
}
_GPU_INPUTS = {
    "gpu_kind": "kind",
    "gpu_count": "count",
    "gpu_profile": "profile",
    "gpu_model": "model",
}
_TOP_INPUTS = ("name", "team", "image", "command", "env", "priority", "time_limit_s", "depends_on")
# What the form calls each input (its label), for the list of problems.
JOB_FORM_LABELS: dict[str, str] = {
    "name": "Name",
    "team": "Team",
    "image": "Image",
    "command": "Command",
    "env": "Environment",
    "gpu_kind": "GPU kind",
    "gpu_count": "GPU count",
    "gpu_profile": "MIG profile",
    "gpu_model": "GPU model",
    "priority": "Priority",
    "time_limit_s": "Time limit",
    "depends_on": "Depends on",
    "preemptible": "Preemptible",
}

QUOTA_FIELDS = (
    "weight",
    "guaranteed_units",
    "limit_units",
    "max_priority",
    "member_limit_units",
    "budget_gpu_hours",
)


def job_form_values(post: QueryDict | None) -> dict[str, str]:
    """The submit form's inputs as text: the defaults on GET, what was sent on POST."""
    if post is None:
        return dict(JOB_FORM_DEFAULTS)
    values = {name: post.get(name, "") for name in JOB_FORM_DEFAULTS}
    # An unticked checkbox is not sent at all.
    values["preemptible"] = "on" if post.get("preemptible") else "off"
    return values


def job_request_data(values: Mapping[str, str]) -> dict[str, Any]:
    """The submit form's text values in the shape ``validate_job_request`` reads."""
    data: dict[str, Any] = {name: values[name] for name in _TOP_INPUTS}
    data["preemptible"] = values["preemptible"]
    kind = values["gpu_kind"]
    gpu = {"kind": kind, "count": values["gpu_count"]}
    # The profile and model inputs always send a value, but each one is shown (and means
    # something) only for its kind: MIG, whole GPUs. A hidden one is left out, so no error can
    # point at an input the person does not see.
    if kind == "mig":
        gpu["profile"] = values["gpu_profile"]
    if kind == "whole":
        gpu["model"] = values["gpu_model"]
    if values.get("gpu_min_count"):
        gpu["min_count"] = values["gpu_min_count"]
    if values.get("gpu_multi_node"):
        gpu["multi_node"] = values["gpu_multi_node"]
    data["gpu"] = gpu
    return data


def job_form_values_of(request: Mapping[str, Any]) -> dict[str, str]:
    """The submit form's inputs filled with a stored job's request (``job_request_of``), so
    a person can resubmit it after changing what they like. The reverse of
    ``job_request_data``: the command as a line a shell splits back the same way, the
    environment as ``KEY=VALUE`` lines sorted by name (PostgreSQL's jsonb keeps no order of
    its own), the dependencies as ``12, 13:after_any``."""
    gpu = request["gpu"]
    values = dict(JOB_FORM_DEFAULTS)
    values.update(
        name=request["name"],
        team=request["team"],
        image=request["image"],
        command=shell_join(request["command"]),
        env="\n".join(f"{key}={value}" for key, value in sorted(request["env"].items())),
        gpu_kind=gpu["kind"],
        gpu_count=str(gpu["count"]),
        gpu_model=gpu.get("model", ""),
        gpu_min_count=str(gpu.get("min_count", "")),
        gpu_multi_node="true" if gpu.get("multi_node") else "",
        priority=request["priority"],
        time_limit_s=str(request["time_limit_s"] or ""),
        preemptible="on" if request["preemptible"] else "off",
        depends_on=", ".join(
            f"{d['job']}" if d["kind"] == "after_ok" else f"{d['job']}:{d['kind']}"
            for d in request["depends_on"]
        ),
    )
    if gpu.get("profile"):
        values["gpu_profile"] = gpu["profile"]
    return values


@dataclass(frozen=True)
class FormError:
    """One problem with a form, as a person reads it: the input's label and what is wrong."""

    label: str
    message: str
    input: str | None  # the input it is about (to link to); None for the form as a whole


def job_form_errors(errors: Mapping[str, str]) -> tuple[dict[str, list[str]], list[FormError]]:
    """Validation errors as (input name -> its messages, every problem in the form's order).

    The first goes next to each input; the second is the list at the top of the form, so
    all problems show at once, also one about an input that is scrolled out of view.
    """
    by_input: dict[str, list[str]] = {}
    general: list[FormError] = []
    for dotted, message in errors.items():
        name = _input_for(dotted)
        if name is None:
            general.append(FormError(label=_label_for_path(dotted), message=message, input=None))
        else:
            by_input.setdefault(name, []).append(f"{_detail(dotted, message)}{message}")
    problems = [
        FormError(label=JOB_FORM_LABELS[name], message=message, input=name)
        for name in JOB_FORM_LABELS
        for message in by_input.get(name, ())
    ]
    return by_input, problems + general


def _input_for(dotted: str) -> str | None:
    head, _, rest = dotted.partition(".")
    if head == "gpu":
        sub = rest.split(".")[0]
        if not sub:
            return "gpu_kind"  # the request as a whole ("required")
        name = f"gpu_{sub}"
        return name if name in _GPU_INPUTS else None
    return head if head in _TOP_INPUTS or head == "preemptible" else None


def _detail(dotted: str, message: str) -> str:
    """Which part of a list or mapping input an error is about, in words: ``argument 2: ``
    for ``command.1``, ``dependency 2: `` for ``depends_on.1.kind``, ``FOO: `` for ``env.FOO``
    (unless the message starts with the name already)."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return ""
    if head == "command":
        return f"argument {int(rest.split('.')[0]) + 1}: "
    if head == "depends_on":
        return f"dependency {int(rest.split('.')[0]) + 1}: "
    if head == "env" and not message.startswith(rest):
        return f"{rest}: "
    return ""


def _label_for_path(dotted: str) -> str:
    """A request path no input shows (``gpu.min_count``), in words (``GPU request, min count``)."""
    head, _, rest = dotted.partition(".")
    label = "GPU request" if head == "gpu" else head.replace("_", " ").capitalize()
    return f"{label}, {rest.replace('.', ' ').replace('_', ' ')}" if rest else label


def quota_form_values(post: QueryDict | None, overview: Mapping[str, Any]) -> dict[str, str]:
    """The quota form's inputs as text: the team's numbers on GET, what was sent on POST."""
    if post is not None:
        return {name: post.get(name, "").strip() for name in QUOTA_FIELDS}
    return {name: audit_text(overview[name]) for name in QUOTA_FIELDS}
