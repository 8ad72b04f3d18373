"""Job arrays: at most ``max_running`` members of an array hold slices at once.

Slurm's ``--array=0-99%4``. The snapshot names each throttled array's limit
(``Snapshot.array_limits``); the members holding slices are the running jobs whose
``Job.array`` is that array, and a member placed during the pass counts at once.

Admission (step 4): a member of an array at its limit waits with ``ARRAY_THROTTLE`` before
anything else is looked at (quota, a place, preemption, a reservation). The throttle is the
array's own choice, not a shortage: such a job neither preempts nor reserves, and the jobs
behind it are considered as if it were not in the queue.

Explaining (step 5): a throttled member starts at the earliest when a member's end frees a
place for it. The running members end at their time limits; the waiting members take the
places in the order the pass considered them, each for its own time limit. Unknown ends
(no time limit) make the estimate unknown.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from scheduler.model import Job, PendingCode
from scheduler.quota import Blocked, Held, Numbers


class ArrayThrottle:
    """The members of throttled arrays that hold slices during one pass, and those that wait."""

    def __init__(self, limits: Mapping[str, int], held: Iterable[Held]) -> None:
        self._limits = limits
        # array -> when each member holding slices ends (inf: unknown)
        self._ends: dict[str, list[float]] = {}
        # array -> the time limits of its throttled members, in the order they were considered
        self._waiting: dict[str, list[float | None]] = {}
        # array -> (the places as a heap of end times, start estimates so far)
        self._starts: dict[str, tuple[list[float], list[float]]] = {}
        if limits:
            for run, _, _, end in held:
                array = run.job.array
                if array in limits:
                    self._ends.setdefault(array, []).append(math.inf if end is None else end)

    def blocked(self, job: Job) -> Blocked | None:
        """Why ``job`` waits for its array (None: it does not)."""
        array = job.array
        if not array:
            return None
        limit = self._limits.get(array)
        if limit is None:
            return None
        ends = self._ends.get(array)
        running = len(ends) if ends else 0
        if running < limit:
            return None
        waiting = self._waiting.setdefault(array, [])
        numbers: Numbers = {
            "array": array,
            "running": running,
            "max_running": limit,
            "ahead": len(waiting),  # members of the array waiting before this one
        }
        waiting.append(job.time_limit_s)
        return (PendingCode.ARRAY_THROTTLE, numbers)

    def placed(self, job: Job, end: float | None) -> None:
        """``job`` was placed in this pass; it ends at ``end`` at the latest (None: unknown)."""
        array = job.array
        if array and array in self._limits:
            self._ends.setdefault(array, []).append(math.inf if end is None else end)

    def start(self, array: str, ahead: int, now: float) -> float | None:
        """The earliest start of the throttled member of ``array`` that had ``ahead`` members
        waiting before it (None: unknown). Only once admission is over."""
        limit = self._limits.get(array, 0)
        waiting = self._waiting.get(array, [])
        if limit < 1 or ahead >= len(waiting):
            return None
        found = self._starts.get(array)
        if found is None:
            places = list(self._ends.get(array, []))
            heapq.heapify(places)
            found = self._starts[array] = (places, [])
        places, starts = found
        clock = starts[-1] if starts else now
        while len(starts) <= ahead:
            while len(places) >= limit:
                clock = max(clock, heapq.heappop(places))
            starts.append(clock)
            own = waiting[len(starts) - 1]
            heapq.heappush(places, math.inf if own is None else clock + own)
        at = starts[ahead]
        return None if at == math.inf else at
