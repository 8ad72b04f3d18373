"""The baselines the simulator measures the portal's policy against: FIFO and FIFO + backfill.

Both take the jobs in strict submit order (time queued, then job id), ignore priority
classes and fair share, and never preempt. Plain FIFO stops at the first job that fits
nowhere: it waits with ``NO_FIT`` and every job after it waits behind it
(``WAITING_FOR_RESERVATION``, ``blocked_by``). FIFO + backfill gives that job a reservation
instead (EASY backfill), so later jobs run ahead only where they do not delay it.

They run through the same pass as the portal's policy (``scheduler.core``): quota,
placement, reservations and explanations are the same code. The pass asks the rules here
only for the order of the queue and for what a job that fits nowhere may do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from scheduler.nominate import InSubmitOrder
from scheduler.order import Candidate, Ordered, by_age

if TYPE_CHECKING:
    from scheduler.core import Cycle


class Fifo:
    """``Policy.FIFO`` (``backfill=False``) and ``Policy.FIFO_BACKFILL`` (``backfill=True``)."""

    classes = False  # every class alike; no class is refused
    fair_order = False
    reclaim = False
    by_priority = False
    submit_order = True  # age order, and no reclaim asks for a team's guarantee

    def __init__(self, *, backfill: bool) -> None:
        self.backfill = backfill

    def rounds(
        self, cycle: Cycle, candidates: Sequence[Candidate]
    ) -> Iterator[Sequence[Candidate]]:
        yield candidates  # one round: the whole queue

    def order(self, cycle: Cycle, jobs: Sequence[Candidate]) -> Ordered:
        if isinstance(jobs, InSubmitOrder):
            return Ordered(jobs, None)  # in submit order already, nominated as it goes
        if cycle.snapshot.pending_in_submit_order:
            return Ordered(jobs, None)  # the candidates keep the snapshot's order
        return Ordered(sorted(jobs, key=by_age), None)

    def blocked(self, cycle: Cycle, c: Candidate) -> bool:
        """A job that fits nowhere: reserve for it, or (plain FIFO) stop the queue behind it."""
        return cycle.reserve(c) if self.backfill else cycle.block_queue(c)
