"""What a replay leaves behind: one record per job with its run segments.

Every metric is computed from these records alone, so the ``--jobs-out`` CSV (one row per
segment) is enough for anyone to recompute the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch during which a job held its slices."""

    start_s: float
    end_s: float
    preempted: bool  # ended by preemption (its work is lost) rather than by completion
    # The slices it held ("node/gpu..." ids): where it ran, for the metrics that look at
    # nodes (``metrics.guarantee_overruns``); not part of a segment's identity.
    slice_ids: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    tenant: str
    gpus: float  # GPU units held while running (whole GPUs for whole-GPU jobs)
    submit_s: float
    duration_s: float
    segments: tuple[Segment, ...] = ()

    @property
    def finished(self) -> bool:
        return bool(self.segments) and not self.segments[-1].preempted

    @property
    def end_s(self) -> float:
        return self.segments[-1].end_s

    @property
    def wait_s(self) -> float:
        """end - submit - duration: queueing plus any work lost to preemption."""
        return self.end_s - self.submit_s - self.duration_s

    @property
    def jct_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def work(self) -> float:
        """Useful GPU-unit-seconds: the completed run only."""
        return self.gpus * self.duration_s
