"""Multi-node gangs: which node is which rank, and the rendezvous environment of each.

A job with ``multi_node`` gets one launch per node it holds slices on (its *parts*). Rank 0
is the job's first node (``Job.node``, the scheduler's first node of the gang, where it placed
the most slices); the others follow by node name. So every node's launch, and every resend of
it, agrees on the layout without storing it: it follows from the attempt's allocations.

The environment (docs/agent.md, "Multi-node gangs"), what torchrun users expect with one
process per slice (``--nproc-per-node=$LOCAL_WORLD_SIZE``):

- ``MASTER_ADDR``: rank 0's address as its agent reports it (``PORTAL_AGENT_ADDRESS``; the
  node's hostname for agents older than that), ``MASTER_PORT``: ``PORTAL_GANG_PORT_BASE`` +
  job id mod ``PORTAL_GANG_PORTS``;
- ``NNODES``, ``NODE_RANK`` (also ``GROUP_RANK``): nodes, and this node's place among them;
- ``LOCAL_WORLD_SIZE``: this node's slices; ``WORLD_SIZE``: the gang's slices (all processes);
  ``RANK``: the global rank of this node's first process (the slices of the nodes before it),
  so that process ``i`` of the node is ``RANK + i``, as torchrun numbers its workers;
- ``PORTAL_GANG_HOSTS``: the nodes' addresses in rank order, comma-separated;
  ``PORTAL_GANG_SLOTS``: ``address:slices`` in rank order (Horovod's ``-H``; a DeepSpeed
  hostfile line is ``address slots=slices``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from portal.jobs.models import Allocation

# The variables a gang's launch sets; they win over the user's env of the same names.
GANG_ENV_KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "NNODES",
    "PORTAL_GANG_HOSTS",
    "PORTAL_GANG_SLOTS",
)


@dataclass(frozen=True, slots=True)
class GangMember:
    """One node of a gang's attempt: its rank, where it is reached, how many slices it has."""

    rank: int
    node: str
    node_id: int
    address: str
    slots: int


def gang_members(*, job_id: int, attempt: int, first: str) -> tuple[GangMember, ...]:
    """The members of a gang's attempt, from its allocations (held or already released):
    ``first`` (the job's node) is rank 0, the others follow by name. A node is reached at the
    address its agent reported, else at its hostname, else at its name."""
    slots: dict[str, int] = {}
    nodes: dict[str, tuple[int, str]] = {}
    rows = Allocation.objects.filter(job_id=job_id, attempt=attempt).values_list(
        "slice__gpu__node__name",
        "slice__gpu__node_id",
        "slice__gpu__node__address",
        "slice__gpu__node__hostname",
    )
    for name, node_id, address, hostname in rows:
        slots[name] = slots.get(name, 0) + 1
        nodes[name] = (node_id, address or hostname or name)
    order = sorted(slots, key=lambda name: (name != first, name))
    return tuple(
        GangMember(
            rank=rank, node=name, node_id=nodes[name][0], address=nodes[name][1], slots=slots[name]
        )
        for rank, name in enumerate(order)
    )


def master_port(job_id: int) -> int:
    """The gang's rendezvous port on its first node: the same for every node and every
    resend, and for every attempt (a requeued attempt may land on another first node)."""
    return int(settings.GANG_PORT_BASE) + job_id % int(settings.GANG_PORTS)


def rendezvous_env(members: Sequence[GangMember], *, node: str, job_id: int) -> dict[str, str]:
    """The rendezvous variables of ``node``'s part of a gang (the module docstring)."""
    mine = next(m for m in members if m.node == node)
    return {
        "MASTER_ADDR": members[0].address,
        "MASTER_PORT": str(master_port(job_id)),
        "WORLD_SIZE": str(sum(m.slots for m in members)),
        "RANK": str(sum(m.slots for m in members if m.rank < mine.rank)),
        "NODE_RANK": str(mine.rank),
        "GROUP_RANK": str(mine.rank),
        "LOCAL_WORLD_SIZE": str(mine.slots),
        "NNODES": str(len(members)),
        "PORTAL_GANG_HOSTS": ",".join(m.address for m in members),
        "PORTAL_GANG_SLOTS": ",".join(f"{m.address}:{m.slots}" for m in members),
    }
