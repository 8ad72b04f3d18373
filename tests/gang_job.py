"""A gang job for end-to-end tests: every part prints its rendezvous environment, then the
parts meet over TCP as a launcher's store would: node rank 0 listens on MASTER_ADDR:
MASTER_PORT and greets each of the other NNODES - 1 parts, which connect and say who they
are. Used by tests/e2e/test_gang_two_agents.py and tests/e2e/test_many_hosts.py."""

from __future__ import annotations

from portal.jobs.gangs import GANG_ENV_KEYS

RENDEZVOUS = f"""
import os, socket, time
for key in {GANG_ENV_KEYS!r}:
    print(key + "=" + os.environ.get(key, ""), flush=True)
address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if os.environ["NODE_RANK"] == "0":
    with socket.create_server((address, port)) as server:
        server.settimeout(60)
        for _ in range(int(os.environ["NNODES"]) - 1):
            peer, _ = server.accept()
            with peer:
                print("rank 0 met: " + peer.recv(100).decode(), flush=True)
                peer.sendall(b"welcome")
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with peer:
        peer.sendall(("rank " + os.environ["RANK"] + " of " + os.environ["WORLD_SIZE"]).encode())
        print("node rank " + os.environ["NODE_RANK"] + " heard: " + peer.recv(100).decode(),
              flush=True)
"""


def gang_env(log: str) -> dict[str, str]:
    """The rendezvous variables a part printed (RENDEZVOUS's first lines)."""
    pairs = (line.split("=", 1) for line in log.splitlines() if "=" in line)
    return {key: value for key, value in pairs if key in GANG_ENV_KEYS}
