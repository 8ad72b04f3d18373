"""Small builders for tests of the portal (teams, users, slices, jobs in any state).

They write rows directly so a test can start from any situation (a RUNNING job on a MIG
slice, say) in a line or two; the behaviour under test still goes through the services.
Imported by tests only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from portal.cluster.models import Gpu, Node, Slice
from portal.cluster.services import inventory_changed
from portal.jobs.models import Allocation, Job, JobEvent, JobState
from portal.tenants.models import Membership, Team
from portal.tenants.tokens import token_issue
from scheduler.units import mig_units

DEMO_PASSWORD = "test-password-123"


@functools.cache
def _demo_password_hash() -> str:
    return make_password(DEMO_PASSWORD)


def make_team(name: str = "vision", **fields: Any) -> Team:
    defaults: dict[str, Any] = {
        "weight": 1.0,
        "guaranteed_units": 1.0,
        "limit_units": 4.0,
        "max_priority": "normal",
    }
    defaults.update(fields)
    return Team.objects.create(name=name, **defaults)


def make_user(
    username: str,
    *,
    team: Team | None = None,
    role: str = Membership.Role.MEMBER,
    site_admin: bool = False,
) -> Any:
    # One hash shared by every test user: hashing is slow on purpose, and tests make many.
    user = get_user_model().objects.create(
        username=username,
        password=_demo_password_hash(),
        is_staff=site_admin,
        is_superuser=site_admin,
    )
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


def make_job(
    *,
    team: Team,
    user: Any,
    state: str = JobState.PENDING,
    name: str = "job",
    gpu_kind: str = "whole",
    gpu_count: int = 1,
    gpu_profile: str = "",
    attempt: int | None = None,
    submitted_at: datetime | None = None,
    **fields: Any,
) -> Job:
    """A job row in ``state`` with a first "submitted" event (attempt 1 once it was assigned)."""
    now = submitted_at or timezone.now()
    if attempt is None:
        attempt = 0 if state in (JobState.PENDING, JobState.HELD) else 1
    job = Job.objects.create(
        team=team,
        user=user,
        name=name,
        image="python:3.11-slim",
        command=["python", "-c", "print('hi')"],
        gpu_kind=gpu_kind,
        gpu_count=gpu_count,
        gpu_profile=gpu_profile,
        state=state,
        attempt=attempt,
        submitted_at=now,
        queued_since=now,
        **fields,
    )
    JobEvent.objects.create(job=job, at=now, from_state="", to_state=JobState.PENDING)
    return job


def make_node(name: str = "node-1", *, gpus: Sequence[dict[str, Any]] = ()) -> Node:
    """A node with GPUs, each given as ``{"mode": "whole"|"mig"|"mps", "profiles": [...],
    "shares": n}``; returns the node. Slices get keys like ``GPU-node-1-0`` (+ suffixes)."""
    node = Node.objects.create(name=name, hostname=name, driver="described")
    for index, spec in enumerate(gpus):
        mode = spec.get("mode", "whole")
        uuid = f"GPU-{name}-{index}"
        gpu = Gpu.objects.create(
            node=node, uuid=uuid, index=index, model=spec.get("model", "NVIDIA A100"), mode=mode
        )
        if mode == "whole":
            Slice.objects.create(gpu=gpu, key=uuid, kind="whole", units=1.0)
        elif mode == "mig":
            for number, profile in enumerate(spec.get("profiles", ["1g.10gb"])):
                Slice.objects.create(
                    gpu=gpu,
                    key=f"MIG-{name}-{index}-{number}",
                    kind="mig",
                    profile=profile,
                    mig_uuid=f"MIG-{name}-{index}-{number}",
                    units=mig_units(profile),
                )
        else:
            shares = spec.get("shares", 4)
            for number in range(shares):
                Slice.objects.create(
                    gpu=gpu, key=f"{uuid}/mps/{number}", kind="mps", units=1.0 / shares
                )
    inventory_changed()
    return node


def allocate(job: Job, slice_keys: Sequence[str], *, released: bool = False) -> None:
    """Give ``job``'s current attempt the slices ``slice_keys`` (and its node)."""
    now = timezone.now()
    slices = list(Slice.objects.filter(key__in=slice_keys).select_related("gpu"))
    for slice_ in slices:
        Allocation.objects.create(
            job=job,
            attempt=job.attempt,
            slice=slice_,
            created_at=now,
            released_at=now if released else None,
        )
    if slices:
        Job.objects.filter(pk=job.pk).update(node_id=slices[0].gpu.node_id)
        job.refresh_from_db()


class World:
    """The demo's people: teams vision and nlp; alice, vera (admin), bob, nick (admin), admin."""

    def __init__(self) -> None:
        self.vision = make_team("vision", limit_units=4.0, guaranteed_units=2.0)
        self.nlp = make_team("nlp", limit_units=3.0, guaranteed_units=1.0)
        self.alice = make_user("alice", team=self.vision)
        self.vera = make_user("vera", team=self.vision, role=Membership.Role.ADMIN)
        self.bob = make_user("bob", team=self.nlp)
        self.nick = make_user("nick", team=self.nlp, role=Membership.Role.ADMIN)
        self.admin = make_user("admin", site_admin=True)


def token_client(user: Any) -> Any:
    """A DRF test client that calls the API with a fresh token of ``user``."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=user)}")
    return client
