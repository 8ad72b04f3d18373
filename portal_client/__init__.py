"""A small client for the GPU portal's REST API, for notebooks and scripts.

    from portal_client import PortalClient

    portal = PortalClient.from_env()  # PORTAL_URL and PORTAL_TOKEN
    job = portal.submit(name="hello", team="vision", image="python:3.11-slim",
                        command=["python", "-c", "print('hi')"], gpu={"kind": "whole"})
    print(portal.wait(job["id"])["state"], portal.log(job["id"]))

Standard library only, so it installs anywhere a notebook runs; it never imports the portal.
"""

from portal_client.client import (
    TERMINAL,
    Dependency,
    GpuRequest,
    JobRequest,
    PortalClient,
    PortalError,
)

__all__ = ["TERMINAL", "Dependency", "GpuRequest", "JobRequest", "PortalClient", "PortalError"]
