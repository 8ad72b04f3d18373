"""The GPU portal's Python client, for notebooks and scripts (and the `gpu-portal` CLI).

    from portal_client import PortalClient

    portal = PortalClient.from_env()  # PORTAL_URL and PORTAL_TOKEN, or `gpu-portal login`
    job = portal.submit(name="hello", team="vision", image="python:3.11-slim",
                        command=["python3", "-c", "print('hi')"], gpu={"kind": "mps"})
    job.wait()                 # one live line: state, reason, position, ETA, elapsed
    print(job.logs())          # or job.logs(follow=True) to print it as it comes

It needs httpx and tqdm only and never imports the portal. Every error is a `PortalError`;
docs/client.md has all of it.
"""

from portal_client.client import (
    ArraySpec,
    Dependency,
    GpuRequest,
    JobRequest,
    PortalClient,
    __version__,
)
from portal_client.config import ConfigError
from portal_client.errors import (
    AuthenticationError,
    Conflict,
    NotFound,
    PermissionDenied,
    PortalError,
    PortalUnavailable,
    RateLimited,
    ValidationError,
    WaitTimeout,
)
from portal_client.jobs import STATES, TERMINAL, Job

from_env = PortalClient.from_env

__all__ = [
    "STATES",
    "TERMINAL",
    "ArraySpec",
    "AuthenticationError",
    "ConfigError",
    "Conflict",
    "Dependency",
    "GpuRequest",
    "Job",
    "JobRequest",
    "NotFound",
    "PermissionDenied",
    "PortalClient",
    "PortalError",
    "PortalUnavailable",
    "RateLimited",
    "ValidationError",
    "WaitTimeout",
    "__version__",
    "from_env",
]
