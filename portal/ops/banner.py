"""What `runportal` prints once the web server answers: where to go and how to log in."""

from __future__ import annotations

import os
import textwrap

from django.contrib.auth import get_user_model
from django.db import DatabaseError, connections

from portal.tenants.management.commands import seed_demo
from workers.launchers.process import plan_isolation
from workers.settings import SettingsError, job_uids_from


def demo_logins() -> tuple[list[str], str]:
    """The seed command's users that exist in the database, described, and its password."""
    wanted = {
        username: _describe(team, role, site_admin)
        for username, team, role, site_admin in seed_demo.USERS
    }
    try:
        found = set(
            get_user_model().objects.filter(username__in=wanted).values_list("username", flat=True)
        )
    except DatabaseError:
        found = set()
    finally:
        connections.close_all()
    password = os.environ.get("PORTAL_DEMO_PASSWORD", "").strip() or seed_demo.DEFAULT_PASSWORD
    return [f"{name} ({what})" for name, what in wanted.items() if name in found], password


def _describe(team: str | None, role: object, site_admin: bool) -> str:
    if site_admin:
        return "site admin"
    label = getattr(role, "label", str(role)).lower()
    return f"{label} of {team}"


def ready_text(*, url: str, seconds: float, nodes: list[str]) -> str:
    users, password = demo_logins()
    lines = ["", "=" * 72, f"  GPU portal is up at {url}   (ready in {seconds:.1f} s)", ""]
    if users:
        lines.append("  Log in as one of:")
        lines += [f"    {user}" for user in users]
        lines.append(f"  password: {password}   (unless you set another one before)")
    else:
        lines.append("  No demo users yet: run `python manage.py seed_demo` (make run does).")
    lines += [
        "",
        "  API token:  python manage.py issue_token alice",
        f"  then:       curl -H 'Authorization: Token <token>' {url}api/v1/jobs/",
        f"  API docs:   {url}api/docs/",
        "",
        "  Agents: " + (", ".join(nodes) if nodes else "none (--no-agent)"),
        *(_wrap("  Jobs:   ", job_isolation()) if nodes else []),
        "  Ctrl-C stops everything.",
        "=" * 72,
        "",
    ]
    return "\n".join(lines)


def job_isolation() -> str:
    """What the local agent's process launcher isolates on this host, and what it does not
    (the same line the agent logs at start)."""
    try:
        uids = job_uids_from(os.environ.get("PORTAL_AGENT_JOB_UIDS", "").strip() or None)
        network = os.environ.get("PORTAL_AGENT_JOB_NETWORK", "").strip() or "auto"
        return plan_isolation(job_uids=uids, network=network).summary()
    except SettingsError as error:
        return f"jobs cannot start: {error}"


def _wrap(label: str, text: str, width: int = 70) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=label, subsequent_indent=" " * len(label))
