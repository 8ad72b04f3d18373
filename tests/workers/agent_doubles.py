"""Test doubles for the agent: a sender that records reports, a scripted launcher, builders."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from workers.protocol import Device, Finished, Launch, LogChunk, Message, Reports, Started
from workers.signing import seal

GPU_0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
GPU_3 = "GPU-3c3c3c3c-0000-4000-8000-000000000003"
MIG_1 = "MIG-1b1b1b1b-0000-4000-8000-000000000001"

WHOLE_GPU = Device(slice_id="node/0", kind="whole", gpu_uuid=GPU_0, gpu_index=0)
MIG_SLICE = Device(
    slice_id="node/2/mig/1",
    kind="mig",
    gpu_uuid=GPU_0,
    gpu_index=2,
    mig_uuid=MIG_1,
    profile="1g.10gb",
)
MPS_SHARE = Device(
    slice_id="node/3/mps/0",
    kind="mps",
    gpu_uuid=GPU_3,
    gpu_index=3,
    mps_fraction=0.25,
    memory_mb=20480,
)


NODE = "node-h"
# A node key as `manage.py node_add` makes them (32 random bytes); tests sign with it.
TEST_KEY = bytes(range(32))


def sealed(message: Message, *, node: str = NODE, key: bytes = TEST_KEY, now: float) -> dict:
    """`message` in the signed envelope the portal would send to `node`."""
    return seal(message, node=node, key=key, now=now)


def make_launch(
    command: list[str],
    *,
    node: str = NODE,
    job_id: int = 1,
    attempt: int = 0,
    devices: tuple[Device, ...] = (WHOLE_GPU,),
    env: dict[str, str] | None = None,
    time_limit_s: float | None = None,
) -> Launch:
    return Launch(
        node=node,
        job_id=job_id,
        attempt=attempt,
        name=f"job-{job_id}",
        team="vision",
        user="alice",
        image="python:3.11-slim",
        command=tuple(command),
        env=env or {},
        devices=devices,
        time_limit_s=time_limit_s,
    )


class RecordingSender:
    """Stands in for the broker: keeps every message the agent would send, in order; the
    reports of a `reports` batch one by one in `messages`, the batches as sent in `batches`."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.batches: list[Reports] = []
        self.broken: Exception | None = None  # set to make every send fail (broker away)
        self._changed = threading.Condition()

    def __call__(self, message: Message) -> None:
        if self.broken is not None:
            raise self.broken
        with self._changed:
            if isinstance(message, Reports):
                self.batches.append(message)
                self.messages.extend(message.reports)
            else:
                self.messages.append(message)
            self._changed.notify_all()

    def of_type(self, kind: type) -> list[Any]:
        with self._changed:
            return [m for m in self.messages if isinstance(m, kind)]

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching report in {timeout}s; got {self.messages}")
                self._changed.wait(left)

    def finished(self, job_id: int = 1, attempt: int = 0, timeout: float = 15.0) -> Finished:
        return self.wait_for(
            lambda m: isinstance(m, Finished) and (m.job_id, m.attempt) == (job_id, attempt),
            timeout,
        )

    def started(self, job_id: int = 1, attempt: int = 0) -> Started:
        return self.wait_for(
            lambda m: isinstance(m, Started) and (m.job_id, m.attempt) == (job_id, attempt)
        )

    def log_text(self, job_id: int = 1, attempt: int = 0) -> str:
        chunks = [m for m in self.of_type(LogChunk) if (m.job_id, m.attempt) == (job_id, attempt)]
        assert [c.seq for c in chunks] == list(range(len(chunks))), "log chunks out of order"
        return "".join(c.data for c in chunks)


class ScriptedRun:
    """A run the test ends by hand: `exit(code)`; `terminate` exits it with 143 (SIGTERM)."""

    def __init__(self, pid: int, output: list[bytes]) -> None:
        self.pid: int | None = pid
        self.container_id: str | None = None
        self.code: int | None = None
        self.terminated_with: list[float] = []
        self.released = False
        self._output = output
        self._ended = threading.Event()

    def exit(self, code: int) -> None:
        self.code = code
        self._ended.set()

    def output(self, offset: int = 0) -> Iterator[bytes]:
        for piece in self._output:
            yield piece[offset:]
            offset = max(0, offset - len(piece))
        self._ended.wait()

    def wait(self) -> int:
        self._ended.wait()
        assert self.code is not None
        return self.code

    def has_exited(self) -> bool:
        return self.code is not None

    def terminate(self, grace_s: float) -> None:
        self.terminated_with.append(grace_s)
        self.exit(143)

    def ends_before_any_stop(self, code: int) -> None:
        """From now on the job exits with `code` on its own just as a stop goes out, so the
        stop never reaches it (what a real launcher then says through `stop_reached`)."""
        self.stop_reached = lambda: False
        self.terminate = lambda grace_s: self.exit(code)  # type: ignore[method-assign]

    def reap(self) -> None:
        pass

    def release(self) -> None:
        self.released = True


class ScriptedLauncher:
    """Starts ScriptedRuns and remembers them; `fail_with` makes every start raise."""

    name = "scripted"

    def __init__(self, fail_with: Exception | None = None, output: list[bytes] | None = None):
        self.runs: list[ScriptedRun] = []
        self.fail_with = fail_with
        self.output = output or []
        self.lease_epochs: list[int | None] = []  # what each start was handed

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> ScriptedRun:
        self.lease_epochs.append(lease_epoch)
        if self.fail_with is not None:
            raise self.fail_with
        run = ScriptedRun(pid=1000 + len(self.runs), output=list(self.output))
        self.runs.append(run)
        return run
