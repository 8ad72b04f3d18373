"""The one validator of a job request, shared by the API and the submit form.

``validate_job_request(data, *, user)`` takes the request as a mapping (parsed JSON, or what
the form gathered) and returns a ``JobRequest`` of checked, normalised values, or raises
``JobRequestError`` with every problem at once: ``{"gpu.profile": "unknown MIG profile ...;
allowed: ..."}``. Field names are dotted paths into the request; each message says what is
allowed. A request that no node of the cluster could ever hold is refused too, with the
largest that would fit, and a GPU model is resolved to the name the inventory reports
(``portal.jobs.cluster_fit``, which asks the scheduling core's own rule).

The shape (see docs/api.md)::

    {"name": "hello", "team": "vision", "image": "python:3.11-slim",
     "command": ["python", "-c", "print('hi')"],          # or a shell-like string
     "env": {"SEED": "1"},                                # or "KEY=VALUE" lines
     "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1,
             "min_count": 1, "model": "", "multi_node": false},
     "priority": "normal", "time_limit_s": 3600, "preemptible": true,
     "depends_on": [{"job": 12, "kind": "after_ok"}],    # or "12, 13:after_any"
     "notify": ["end", "fail"]}                           # or "end, fail"; default: my settings

Forms send text, so numbers may also come as digit strings, booleans as "true"/"false"/
"on"/"off"/"1"/"0", and an empty string means "not given" for the optional fields.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Min

from portal.cluster.models import Slice
from portal.compiled_queries import compiled_rows, with_pk
from portal.jobs.cluster_fit import fit_cluster
from portal.jobs.models import NOTIFY_EVENTS, TERMINAL_STATES, Job, JobDependency, JobState
from portal.tenants.models import PRIORITY_CLASSES, Team
from portal.tenants.selectors import memberships_for_user, teams_for_user
from scheduler.model import GpuRequest, SliceKind
from scheduler.units import MIG_PROFILES, parse_mig_profile
from workers.images import allowed_text, image_allowed


class JobRequestError(ValueError):
    """A job request with problems; ``errors`` maps each dotted field to what it accepts."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors.items()))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class DependencySpec:
    job_id: int
    kind: str  # after_ok | after_any


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A checked job request, ready for ``job_submit``.

    ``gpu`` is the scheduling core's own ``GpuRequest``, so what a job may ask for is defined
    once: a rigid gang has ``min_count`` 0, an elastic one 1 <= ``min_count`` < ``count``.
    """

    name: str
    team: Team
    image: str
    command: tuple[str, ...]
    gpu: GpuRequest
    env: Mapping[str, str] = field(default_factory=dict)
    priority: str = "normal"
    time_limit_s: int | None = None
    preemptible: bool = True
    depends_on: tuple[DependencySpec, ...] = ()
    # The events the owner is told about for this job; None: the owner's own settings.
    notify: tuple[str, ...] | None = None
    # Said on the job's "submitted" event (e.g. that the cluster had no GPU to check it against).
    notes: tuple[str, ...] = ()


FIELDS = (
    "name",
    "team",
    "image",
    "command",
    "env",
    "gpu",
    "priority",
    "time_limit_s",
    "preemptible",
    "depends_on",
    "notify",
)
GPU_FIELDS = ("kind", "count", "min_count", "profile", "model", "multi_node")
GPU_KINDS = tuple(kind.value for kind in SliceKind)
DEPENDENCY_KINDS = tuple(JobDependency.Kind.values)

NAME_MAX = 128
IMAGE_MAX = 255  # Job.image's column
TIME_LIMIT_MAX = 2_147_483_647  # Job.time_limit_s is a PositiveIntegerField
JOB_ID_MAX = 2**63 - 1  # the largest id a job can have (a bigint)

# A container image reference as Docker reads it: [registry[:port]/]name[:tag][@digest].
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_RE = re.compile(rf"^{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$")
IMAGE_HELP = "[registry/]name[:tag][@sha256:digest] with a lower-case name, e.g. python:3.11-slim"

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The agent sets these for the slice a job gets; a job must not override them.
RESERVED_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
RESERVED_ENV_PREFIXES = ("CUDA_MPS_", "PORTAL_")
RESERVED_ENV_HELP = "CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_MPS_* and PORTAL_*"

# Smallest first, as people read a list of sizes.
MIG_PROFILES_ALLOWED = ", ".join(
    sorted(
        MIG_PROFILES, key=lambda n: (MIG_PROFILES[n].compute_slices, MIG_PROFILES[n].memory_gb, n)
    )
)

_TRUE = {"true", "on", "1", "yes"}
_FALSE = {"false", "off", "0", "no"}


def validate_job_request(data: Mapping[str, Any], *, user: Any) -> JobRequest:
    """Check a job request from ``user``; return it normalised or raise ``JobRequestError``."""
    if not isinstance(data, Mapping):
        raise JobRequestError({"request": "must be a JSON object with the job's fields"})
    errors: dict[str, str] = {}
    for key in data:
        if key not in FIELDS:
            errors[str(key)] = f"unknown field; allowed: {', '.join(FIELDS)}"

    name = _name(data.get("name"), errors)
    team, own_limit = _team(data.get("team"), user, errors)
    image = _image(data.get("image"), errors)
    if team is not None and "image" not in errors:
        _check_image_allowed(image, team, errors)
    command = _command(data.get("command"), errors)
    env = _env(data.get("env"), errors)
    gpu = _gpu(data.get("gpu"), errors)
    priority = _priority(data.get("priority"), team, errors)
    time_limit_s = _time_limit(data.get("time_limit_s"), errors)
    preemptible = _boolean(data.get("preemptible"), "preemptible", True, errors)
    depends_on = _depends_on(data.get("depends_on"), user, errors)
    notify = _notify(data.get("notify"), errors)
    notes: tuple[str, ...] = ()
    if gpu is not None:
        gpu, notes = fit_cluster(gpu, errors)
    if team is not None and gpu is not None:
        _check_limits(gpu, team, own_limit, errors)

    if errors:
        raise JobRequestError(errors)
    assert team is not None and gpu is not None  # no errors means both were set
    return JobRequest(
        name=name,
        team=team,
        image=image,
        command=command,
        env=env,
        gpu=gpu,
        priority=priority,
        time_limit_s=time_limit_s,
        preemptible=preemptible,
        depends_on=depends_on,
        notify=notify,
        notes=notes,
    )


# --- one function per field ------------------------------------------------------------


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _name(value: Any, errors: dict[str, str]) -> str:
    allowed = f"a text of 1 to {NAME_MAX} characters"
    if _blank(value):
        errors["name"] = f"required; allowed: {allowed}"
        return ""
    if not isinstance(value, str):
        errors["name"] = f"must be text; allowed: {allowed}"
        return ""
    name = value.strip()
    if len(name) > NAME_MAX:
        errors["name"] = f"{len(name)} characters is too long; allowed: {allowed}"
    return name


def _team(value: Any, user: Any, errors: dict[str, str]) -> tuple[Team | None, float | None]:
    """The team named, among ``user``'s, with ``user``'s own limit in it (a team admin sets
    it; None: none): one query for both."""
    memberships = _memberships(user)
    mine = [team for team, _ in memberships]
    allowed = (
        f"allowed: {', '.join(team.name for team in mine)}"
        if mine
        else "you are not a member of any team yet; ask a site admin to add you"
    )
    if isinstance(value, Team):
        value = value.name
    if _blank(value):
        errors["team"] = f"required; {allowed}"
        return None, None
    if not isinstance(value, str):
        errors["team"] = f"must be a team name; {allowed}"
        return None, None
    for team, own_limit in memberships:
        if team.name == value.strip():
            return team, own_limit
    errors["team"] = f"{value!r} is not one of your teams; {allowed}"
    return None, None


def _memberships(user: Any) -> list[tuple[Team, float | None]]:
    """``memberships_for_user``: each team of ``user``'s with the user's own limit in it, by
    team name, from SQL compiled once (``portal.compiled_queries``): every submit asks."""
    if not getattr(user, "is_authenticated", False) or user.pk is None:
        return [(m.team, m.limit_units) for m in memberships_for_user(user=user)]
    names = [field.attname for field in Team._meta.concrete_fields]
    rows = compiled_rows(
        key="memberships_for_user",
        build=lambda values: memberships_for_user(user=with_pk(user, values[0])).values(
            "limit_units", *(f"team__{name}" for name in names)
        ),
        values=[user.pk],
    )
    return [
        (
            Team.from_db(DEFAULT_DB_ALIAS, names, [row[f"team__{name}"] for name in names]),
            row["limit_units"],
        )
        for row in rows
    ]


def _image(value: Any, errors: dict[str, str]) -> str:
    if _blank(value):
        errors["image"] = f"required; allowed: {IMAGE_HELP}"
        return ""
    if not isinstance(value, str):
        errors["image"] = f"must be text; allowed: {IMAGE_HELP}"
        return ""
    image = value.strip()
    if len(image) > IMAGE_MAX:
        errors["image"] = f"longer than {IMAGE_MAX} characters; allowed: {IMAGE_HELP}"
    elif not IMAGE_RE.match(image):
        errors["image"] = f"{image!r} is not an image reference; allowed: {IMAGE_HELP}"
    return image


def _check_image_allowed(image: str, team: Team, errors: dict[str, str]) -> None:
    """The team's image allow-list (empty: any image). The agent checks it again."""
    prefixes = team.image_prefixes()
    if not image_allowed(image, prefixes):
        errors["image"] = (
            f"{image!r} is not allowed for team {team.name}; allowed: images starting with "
            f"{allowed_text(prefixes)}"
        )


def _command(value: Any, errors: dict[str, str]) -> tuple[str, ...]:
    allowed = 'a list of non-empty strings such as ["python", "train.py"], or a shell-like line'
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as error:
            errors["command"] = f"cannot split into arguments ({error}); allowed: {allowed}"
            return ()
    if value is None or (isinstance(value, Sequence) and len(value) == 0):
        errors["command"] = f"required, must not be empty; allowed: {allowed}"
        return ()
    if not isinstance(value, Sequence):
        errors["command"] = f"must be a list; allowed: {allowed}"
        return ()
    for index, argument in enumerate(value):
        if not isinstance(argument, str) or argument == "":
            errors[f"command.{index}"] = f"must be a non-empty string; allowed: {allowed}"
        elif "\x00" in argument:
            errors[f"command.{index}"] = "must not contain a NUL character"
    return tuple(value)


def _env(value: Any, errors: dict[str, str]) -> dict[str, str]:
    allowed = "an object of NAME: value strings, names matching [A-Za-z_][A-Za-z0-9_]*"
    if _blank(value):
        return {}
    if isinstance(value, str):
        value = _env_from_lines(value, errors)
        if value is None:
            return {}
    if not isinstance(value, Mapping):
        errors["env"] = f"must be an object; allowed: {allowed}"
        return {}
    env: dict[str, str] = {}
    bad_names: list[str] = []
    for key, item in value.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            bad_names.append(repr(key))
            continue
        if key in RESERVED_ENV_KEYS or key.startswith(RESERVED_ENV_PREFIXES):
            errors[f"env.{key}"] = (
                f"{key} is reserved: the portal sets {RESERVED_ENV_HELP} for the job's slice"
            )
            continue
        if not isinstance(item, str):
            errors[f"env.{key}"] = 'must be a string (quote numbers, e.g. "1")'
            continue
        if "\x00" in item:
            errors[f"env.{key}"] = "must not contain a NUL character"
            continue
        env[key] = item
    if bad_names:
        errors["env"] = f"invalid variable name {', '.join(bad_names)}; allowed: {allowed}"
    return env


def _env_from_lines(text: str, errors: dict[str, str]) -> dict[str, str] | None:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments skipped), as a form's textarea sends."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, item = stripped.partition("=")
        if not sep:
            errors["env"] = f"line {number} {stripped!r} is not KEY=VALUE"
            return None
        env[key.strip()] = item
    return env


def _gpu(value: Any, errors: dict[str, str]) -> GpuRequest | None:
    example = '{"kind": "whole", "count": 1}'
    if value is None:
        errors["gpu"] = f"required; an object such as {example}"
        return None
    if not isinstance(value, Mapping):
        errors["gpu"] = f"must be an object such as {example}"
        return None
    count_before = len(errors)
    for key in value:
        if key not in GPU_FIELDS:
            errors[f"gpu.{key}"] = f"unknown field; allowed: {', '.join(GPU_FIELDS)}"

    kind: SliceKind | None = None
    given_kind = value.get("kind")
    if _blank(given_kind) or given_kind not in GPU_KINDS:
        shown = "required" if _blank(given_kind) else f"unknown kind {given_kind!r}"
        errors["gpu.kind"] = f"{shown}; allowed: {', '.join(GPU_KINDS)}"
    else:
        kind = SliceKind(given_kind)

    maximum = settings.JOB_MAX_GPU_COUNT
    count = _integer(value.get("count"), "gpu.count", errors, default=1, low=1, high=maximum)
    min_count: int | None = 0  # the core's "rigid"
    if not _blank(value.get("min_count")):
        high = count if count is not None else maximum
        min_count = _integer(value.get("min_count"), "gpu.min_count", errors, low=1, high=high)
        if min_count == count:
            min_count = 0  # an elastic gang from N to N is a rigid one

    profile = _profile(value.get("profile"), kind, errors)
    model = _model(value.get("model"), kind, errors)
    multi_node = _boolean(value.get("multi_node"), "gpu.multi_node", False, errors)
    if len(errors) > count_before or kind is None or count is None or min_count is None:
        return None
    return GpuRequest(
        kind=kind,
        count=count,
        min_count=min_count,
        profile=profile,
        model=model,
        multi_node=multi_node,
    )


def _profile(value: Any, kind: SliceKind | None, errors: dict[str, str]) -> str:
    allowed = MIG_PROFILES_ALLOWED
    if kind is None:
        return ""  # the kind's own error says enough
    if kind != SliceKind.MIG:
        if not _blank(value):
            errors["gpu.profile"] = f"only for kind mig (this request is kind {kind})"
        return ""
    if _blank(value):
        errors["gpu.profile"] = f"required for kind mig; allowed: {allowed}"
        return ""
    if not isinstance(value, str):
        errors["gpu.profile"] = f"must be a profile name; allowed: {allowed}"
        return ""
    try:
        return parse_mig_profile(value).name
    except ValueError:
        errors["gpu.profile"] = f"unknown MIG profile {value!r}; allowed: {allowed}"
        return ""


def _model(value: Any, kind: SliceKind | None, errors: dict[str, str]) -> str:
    if _blank(value) or kind is None:
        return ""
    if kind != SliceKind.WHOLE:
        errors["gpu.model"] = "only for kind whole (a MIG profile or an MPS share names no model)"
        return ""
    if not isinstance(value, str) or len(value.strip()) > 128:
        errors["gpu.model"] = (
            "must be a GPU model name of at most 128 characters, e.g. a100 or NVIDIA A100-SXM4-80GB"
        )
        return ""
    return value.strip()


def _priority(value: Any, team: Team | None, errors: dict[str, str]) -> str:
    allowed = _allowed_priorities(team)
    if _blank(value):
        # "normal" unless the team may not use it; then the team's highest class.
        return "normal" if "normal" in allowed else allowed[-1]
    if value not in PRIORITY_CLASSES:
        errors["priority"] = f"unknown class {value!r}; allowed: {', '.join(allowed)}"
        return ""
    if value not in allowed:
        assert team is not None  # without a team every class is allowed
        errors["priority"] = (
            f"{value!r} is above team {team.name}'s maximum ({team.max_priority}); "
            f"allowed: {', '.join(allowed)}"
        )
        return ""
    return str(value)


def _allowed_priorities(team: Team | None) -> tuple[str, ...]:
    if team is None or team.max_priority not in PRIORITY_CLASSES:
        return PRIORITY_CLASSES
    return PRIORITY_CLASSES[: PRIORITY_CLASSES.index(team.max_priority) + 1]


def _time_limit(value: Any, errors: dict[str, str]) -> int | None:
    if _blank(value):
        return None
    return _integer(value, "time_limit_s", errors, low=1, high=TIME_LIMIT_MAX, what="seconds")


def _depends_on(value: Any, user: Any, errors: dict[str, str]) -> tuple[DependencySpec, ...]:
    allowed_kinds = ", ".join(DEPENDENCY_KINDS)
    if _blank(value):
        return ()
    if isinstance(value, str):
        value = _dependencies_from_text(value)
    if not isinstance(value, Sequence):
        errors["depends_on"] = (
            f'must be a list such as [{{"job": 12, "kind": "after_ok"}}]; kinds: {allowed_kinds}'
        )
        return ()
    wanted: dict[int, str] = {}
    for index, item in enumerate(value):
        job_value, kind = (
            (item.get("job"), item.get("kind")) if isinstance(item, Mapping) else (item, None)
        )
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - {"job", "kind"})
            if unknown:
                errors[f"depends_on.{index}"] = f"unknown field {unknown[0]!r}; allowed: job, kind"
                continue
        kind = kind or JobDependency.Kind.AFTER_OK
        job_id = _integer(job_value, f"depends_on.{index}.job", errors, low=1, what="a job id")
        if kind not in DEPENDENCY_KINDS:
            errors[f"depends_on.{index}.kind"] = f"unknown kind {kind!r}; allowed: {allowed_kinds}"
            continue
        if job_id is None:
            continue
        if job_id in wanted:
            errors[f"depends_on.{index}.job"] = f"job {job_id} is listed twice"
            continue
        wanted[job_id] = str(kind)
    if not wanted:
        return ()
    # An id beyond a bigint is no job (and no database query could take it): unknown too.
    queried = [job_id for job_id in wanted if job_id <= JOB_ID_MAX]
    visible = dict(
        Job.objects.filter(pk__in=queried, team__in=teams_for_user(user=user)).values_list(
            "pk", "state"
        )
    )
    unknown_ids = [job_id for job_id in wanted if job_id not in visible]
    if unknown_ids:
        errors["depends_on"] = (
            f"unknown job {', '.join(str(i) for i in unknown_ids)}; "
            "allowed: ids of jobs of your teams"
        )
    doomed = [
        job_id
        for job_id, kind in wanted.items()
        if kind == JobDependency.Kind.AFTER_OK
        and visible.get(job_id) in TERMINAL_STATES
        and visible.get(job_id) != JobState.SUCCEEDED
    ]
    if doomed and "depends_on" not in errors:
        errors["depends_on"] = (
            f"job {', '.join(str(i) for i in doomed)} already ended without success, so an "
            "after_ok job could never start; allowed: after_any, or a job that can still succeed"
        )
    return tuple(DependencySpec(job_id=job_id, kind=kind) for job_id, kind in wanted.items())


def _notify(value: Any, errors: dict[str, str]) -> tuple[str, ...] | None:
    """A list of event names (a form sends them comma-separated); absent or null: the owner's
    settings decide; an empty list: nothing about this job."""
    allowed = f"a list of {', '.join(NOTIFY_EVENTS)} (or [] for none)"
    if _blank(value):
        return None
    if isinstance(value, str):
        value = [part for part in re.split(r"[,\s]+", value.strip()) if part]
    if not isinstance(value, Sequence):
        errors["notify"] = f"must be a list; allowed: {allowed}"
        return None
    unknown = [repr(item) for item in value if item not in NOTIFY_EVENTS]
    if unknown:
        errors["notify"] = f"unknown event {', '.join(unknown)}; allowed: {allowed}"
        return None
    return tuple(event for event in NOTIFY_EVENTS if event in value)


def _dependencies_from_text(text: str) -> list[Any]:
    """``"12, 13:after_any"`` as a form's text field sends it."""
    items: list[Any] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if part:
            job, _, kind = part.partition(":")
            items.append({"job": job, "kind": kind or JobDependency.Kind.AFTER_OK})
    return items


# --- cross-field checks ----------------------------------------------------------------


def _check_limits(
    gpu: GpuRequest, team: Team, own_limit: float | None, errors: dict[str, str]
) -> None:
    """Refuse a request that could never run: more GPU units than the team may ever hold.

    An elastic gang is measured by its minimum, since it can run with that many. For MPS the
    units of a share depend on the GPU, so the smallest share in the cluster is used (the
    check only refuses what is certain never to fit).
    """
    each = _units_per_slice(gpu)
    if each is None:
        return
    needed = each * gpu.minimum
    # A member's own limit (set by a team admin) tightens the team's per-member limit.
    for limit, whose in (
        (team.limit_units, f"team {team.name}'s limit"),
        (team.member_limit_units, f"team {team.name}'s per-member limit"),
        (own_limit, f"your own limit in team {team.name}"),
    ):
        if limit is not None and needed > limit + 1e-9:
            most = math.floor(limit / each + 1e-9)
            counted = "min_count" if gpu.min_count else "count"
            errors[f"gpu.{counted}"] = (
                f"over-limit count: {gpu.minimum} x {_slice_name(gpu)} = {_units(needed)} GPU "
                f"units, above {whose} of {_units(limit)} units; allowed: at most {most}"
            )
            return


def _units_per_slice(gpu: GpuRequest) -> float | None:
    if gpu.kind == SliceKind.WHOLE:
        return 1.0
    if gpu.kind == SliceKind.MIG:
        return MIG_PROFILES[gpu.profile].units
    smallest = Slice.objects.filter(kind=Slice.Kind.MPS, present=True).aggregate(
        units=Min("units")
    )["units"]
    return smallest if smallest else None


def _slice_name(gpu: GpuRequest) -> str:
    if gpu.kind == SliceKind.MIG:
        return f"MIG {gpu.profile}"
    return "whole GPU" if gpu.kind == SliceKind.WHOLE else "MPS share"


def _units(value: float) -> str:
    return f"{round(value, 2):g}"


# --- typed readers ---------------------------------------------------------------------


def _integer(
    value: Any,
    name: str,
    errors: dict[str, str],
    *,
    default: int | None = None,
    low: int = 1,
    high: int | None = None,
    what: str = "a whole number",
) -> int | None:
    allowed = f"{what} from {low} to {high}" if high is not None else f"{what} >= {low}"
    if _blank(value):
        if default is None:
            errors[name] = f"required; allowed: {allowed}"
        return default
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        number = int(value)
    if number is None:
        errors[name] = f"{value!r} is not a whole number; allowed: {allowed}"
        return None
    if number < low or (high is not None and number > high):
        errors[name] = f"{number} is out of range; allowed: {allowed}"
        return None
    return number


def _boolean(value: Any, name: str, default: bool, errors: dict[str, str]) -> bool:
    if _blank(value):
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    errors[name] = f"{value!r} is not a boolean; allowed: true, false"
    return default
