"""What the pages' forms send, turned into what the services take, and their errors back.

No validation lives here: ``validate_job_request`` and ``quota_update`` check the values and
name what is allowed. This module only maps form field names to the request's dotted names
and back, so each error shows next to the input it is about.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import QueryDict

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
}
_GPU_INPUTS = {
    "gpu_kind": "kind",
    "gpu_count": "count",
    "gpu_profile": "profile",
    "gpu_model": "model",
}
_TOP_INPUTS = ("name", "team", "image", "command", "env", "priority", "time_limit_s", "depends_on")

QUOTA_FIELDS = ("weight", "guaranteed_units", "limit_units", "max_priority")


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
    gpu = {"kind": kind, "count": values["gpu_count"], "model": values["gpu_model"]}
    # The profile select always sends a value; it only means something for MIG.
    if kind == "mig":
        gpu["profile"] = values["gpu_profile"]
    data["gpu"] = gpu
    return data


def job_form_errors(errors: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Split validation errors into (input name -> message, messages for no single input)."""
    by_input: dict[str, str] = {}
    general: list[str] = []
    for dotted, message in errors.items():
        name = _input_for(dotted)
        if name is None:
            general.append(f"{dotted}: {message}")
        elif name in by_input:
            by_input[name] += f"; {_detail(dotted)}{message}"
        else:
            by_input[name] = f"{_detail(dotted)}{message}"
    return by_input, general


def _input_for(dotted: str) -> str | None:
    head, _, rest = dotted.partition(".")
    if head == "gpu":
        sub = rest.split(".")[0]
        if not sub:
            return "gpu_kind"  # the request as a whole ("required")
        name = f"gpu_{sub}"
        return name if name in _GPU_INPUTS else None
    return head if head in _TOP_INPUTS or head == "preemptible" else None


def _detail(dotted: str) -> str:
    """Which part of a list or mapping input an error is about (``env.FOO`` -> ``FOO: ``)."""
    head, _, rest = dotted.partition(".")
    if head == "command" and rest:
        return f"argument {int(rest.split('.')[0]) + 1}: "
    if head in ("env", "depends_on") and rest:
        return f"{rest}: "
    return ""


def quota_form_values(post: QueryDict | None, overview: Mapping[str, Any]) -> dict[str, str]:
    """The quota form's inputs as text: the team's numbers on GET, what was sent on POST."""
    if post is not None:
        return {name: post.get(name, "").strip() for name in QUOTA_FIELDS}
    return {name: _number_text(overview[name]) for name in QUOTA_FIELDS}


def _number_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
