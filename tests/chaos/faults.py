"""The seeded fault schedule, and the injector that carries it out against a running stack.

A schedule is planned up front from the seed alone (`plan_faults`), so two runs with the same
seed inject the same faults at the same offsets; it is written to the results. Each fault
hits a target that the plan expects to be up again by then; if a restart took longer than
planned, the injector waits for it rather than skip the fault.

Kinds (weights are options; `--weights kill_agent=0` turns one off):

  kill_agent         SIGKILL an agent; restart it (same node name, same work dir) after hold_s
  pause_agent        SIGSTOP an agent for hold_s (longer than the lease), then SIGCONT
  kill_worker        SIGKILL the control-plane worker; restart it after hold_s
  kill_lease         SIGKILL the lease worker (a second consumer of heartbeats); restart it
                     after hold_s
  kill_beat          SIGKILL beat; restart it after hold_s
  kill_web           SIGKILL gunicorn (master and worker); restart it after hold_s
  restart_redis      kill Redis (no persistence: everything queued is lost), start after hold_s
  restart_postgres   pg_ctl stop -m fast, start after hold_s
  drop_message       take one message off a queue (`control` or `node.<name>`): it is lost
  duplicate_message  push a copy of the next message of a queue: it is delivered twice
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .cluster import LEASE_S

DEFAULT_WEIGHTS: dict[str, float] = {
    "kill_agent": 3.0,
    "pause_agent": 2.0,
    "kill_worker": 1.5,
    "kill_lease": 1.0,
    "kill_beat": 1.0,
    "kill_web": 1.0,
    "restart_redis": 1.0,
    "restart_postgres": 1.0,
    "drop_message": 2.0,
    "duplicate_message": 2.0,
}
AGENT_FAULTS = ("kill_agent", "pause_agent")
MESSAGE_FAULTS = ("drop_message", "duplicate_message")
PROCESS_FAULTS = {
    "kill_worker": "worker",
    "kill_lease": "lease",
    "kill_beat": "beat",
    "kill_web": "web",
}
# Seconds a target needs after its hold to be up again (process start, Django import).
RECOVERY_ALLOWANCE_S = {
    "kill_agent": 5.0,
    "pause_agent": 1.0,
    "kill_worker": 6.0,
    "kill_lease": 6.0,
    "kill_beat": 5.0,
    "kill_web": 6.0,
    "restart_redis": 1.0,
    "restart_postgres": 3.0,
}
# How long a message fault waits for a message to appear in a queue.
MESSAGE_WINDOW_S = 5.0
# How long the injector waits for a target still recovering from an earlier fault.
BUSY_WAIT_S = 120.0


@dataclass
class Fault:
    index: int
    at: float  # planned offset from the start of the fault phase, seconds
    kind: str
    target: str  # an agent's node name, worker/beat/web/redis/postgres, or a queue
    hold_s: float  # restart delay, pause length or down time; 0 for message faults
    injected_at: float | None = None  # epoch seconds
    recovered_at: float | None = None
    outcome: str = ""

    def describe(self) -> str:
        if self.kind in MESSAGE_FAULTS:
            return f"{self.kind} on {self.target}"
        verb = {
            "kill_agent": "restart after",
            "pause_agent": "SIGCONT after",
            "restart_redis": "down for",
            "restart_postgres": "down for",
        }.get(self.kind, "restart after")
        return f"{self.kind} {self.target} ({verb} {self.hold_s:.1f} s)"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_weights(text: str) -> dict[str, float]:
    """`kill_agent=3,drop_message=0` over the defaults; unknown kinds are an error."""
    weights = dict(DEFAULT_WEIGHTS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in weights:
            raise ValueError(
                f"--weights: unknown fault kind {name!r}; allowed: {', '.join(DEFAULT_WEIGHTS)}"
            )
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"--weights: {name} needs a number, got {value!r}") from None
        if weights[name] < 0:
            raise ValueError(f"--weights: {name} must be >= 0, got {value!r}")
    if not any(weights.values()):
        raise ValueError("--weights: at least one fault kind needs a weight above 0")
    return weights


def plan_faults(
    *,
    rng: random.Random,
    count: int,
    agents: list[str],
    weights: Mapping[str, float],
    interval_s: tuple[float, float],
    first_at_s: float = 3.0,
) -> list[Fault]:
    """`count` faults, one every `interval_s` (uniform), each on a target the plan expects up."""
    busy_until: dict[str, float] = {}
    faults: list[Fault] = []
    at = first_at_s
    kinds = [kind for kind, weight in weights.items() if weight > 0]
    for index in range(count):
        while True:
            kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
            targets = _targets(kind, agents)
            free = [t for t in targets if busy_until.get(t, 0.0) <= at]
            if free or kind in MESSAGE_FAULTS:
                break
            if all(busy_until.get(t, 0.0) > at for k in kinds for t in _targets(k, agents)):
                # Everything this plan may hit is down: move on to when the first is back.
                at = min(until for until in busy_until.values() if until > at)
        target = rng.choice(free or targets)
        hold = _hold_s(kind, rng)
        if kind not in MESSAGE_FAULTS:
            busy_until[target] = at + hold + RECOVERY_ALLOWANCE_S[kind]
        faults.append(Fault(index=index, at=round(at, 3), kind=kind, target=target, hold_s=hold))
        at += rng.uniform(*interval_s)
    return faults


def _targets(kind: str, agents: list[str]) -> list[str]:
    if kind in AGENT_FAULTS:
        return list(agents)
    if kind in MESSAGE_FAULTS:
        return ["control", *(f"node.{agent}" for agent in agents)]
    if kind in PROCESS_FAULTS:
        return [PROCESS_FAULTS[kind]]
    return [kind.removeprefix("restart_")]


def _hold_s(kind: str, rng: random.Random) -> float:
    if kind == "kill_agent":
        # Some come back within the lease (never marked lost), some after it.
        return round(rng.uniform(1.0, 1.5 * LEASE_S), 2)
    if kind == "pause_agent":
        return round(LEASE_S + rng.uniform(2.0, 8.0), 2)
    if kind == "restart_redis":
        return round(rng.uniform(1.0, 5.0), 2)
    if kind in MESSAGE_FAULTS:
        return 0.0
    return round(rng.uniform(0.5, 3.0), 2)


class Target(Protocol):
    """What the injector needs from the running stack."""

    def kill(self, name: str) -> None: ...
    def restart(self, name: str) -> None: ...
    def pause(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def stop_redis(self) -> None: ...
    def start_redis(self) -> None: ...
    def stop_postgres(self) -> None: ...
    def start_postgres(self) -> None: ...
    def redis_client(self) -> Any: ...


@dataclass
class Injector:
    stack: Target
    faults: list[Fault]
    say: Callable[[str], None]
    started_at: float = 0.0
    _busy: dict[str, threading.Event] = field(default_factory=dict)
    _recoveries: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Inject every fault at its time (blocking); recoveries run on their own threads."""
        self.started_at = time.time()
        for fault in self.faults:
            if self._stop.wait(max(0.0, self.started_at + fault.at - time.time())):
                fault.outcome = "not injected: run stopped"
                continue
            self._wait_until_free(fault)
            self._inject(fault)

    def stop(self) -> None:
        self._stop.set()

    def wait_recovered(self) -> None:
        for thread in self._recoveries:
            thread.join()

    def _wait_until_free(self, fault: Fault) -> None:
        event = self._busy.get(fault.target)
        if event is not None and not event.is_set():
            self.say(f"fault {fault.index}: waiting for {fault.target} to be back first")
            if not event.wait(BUSY_WAIT_S):
                self.say(f"fault {fault.index}: {fault.target} still not back; injecting anyway")

    def _inject(self, fault: Fault) -> None:
        fault.injected_at = time.time()
        self.say(
            f"[{fault.injected_at - self.started_at:8.1f}s] fault {fault.index + 1}/"
            f"{len(self.faults)}: {fault.describe()}"
        )
        try:
            if fault.kind in MESSAGE_FAULTS:
                fault.outcome = self._message_fault(fault)
                fault.recovered_at = time.time()
                self.say(f"           fault {fault.index + 1}: {fault.outcome}")
                return
            self._break(fault)
        except Exception as error:  # noqa: BLE001 - a failed injection is recorded, not fatal
            fault.outcome = f"injection failed: {error!r}"
            self.say(f"           fault {fault.index + 1}: {fault.outcome}")
            return
        event = threading.Event()
        self._busy[fault.target] = event
        thread = threading.Thread(
            target=self._recover, args=(fault, event), name=f"recover-{fault.index}", daemon=True
        )
        self._recoveries.append(thread)
        thread.start()

    def _break(self, fault: Fault) -> None:
        kind, target = fault.kind, fault.target
        if kind == "pause_agent":
            self.stack.pause(target)
        elif kind == "kill_agent" or kind in PROCESS_FAULTS:
            self.stack.kill(target)
        elif kind == "restart_redis":
            self.stack.stop_redis()
        elif kind == "restart_postgres":
            self.stack.stop_postgres()
        else:
            raise ValueError(f"unknown fault kind {kind}")

    def _recover(self, fault: Fault, done: threading.Event) -> None:
        time.sleep(fault.hold_s)
        kind, target = fault.kind, fault.target
        try:
            if kind == "pause_agent":
                self.stack.resume(target)
            elif kind == "restart_redis":
                self.stack.start_redis()
            elif kind == "restart_postgres":
                self.stack.start_postgres()
            else:
                self.stack.restart(target)
            fault.outcome = fault.outcome or "recovered"
        except Exception as error:  # noqa: BLE001
            fault.outcome = f"recovery failed: {error!r}"
        fault.recovered_at = time.time()
        self.say(
            f"[{fault.recovered_at - self.started_at:8.1f}s] fault {fault.index + 1}: "
            f"{target} {fault.outcome}"
        )
        done.set()

    def _message_fault(self, fault: Fault) -> str:
        """Take the next message of the target queue off the broker, the way a consumer
        would (BRPOP): Redis hands a message to the client that has waited longest, which
        is us, since Celery's consumers renew their BRPOP every second. A drop keeps it; a
        duplicate puts it back twice at the consumers' end. A queue that stays empty for the
        window gives way to `control`, which always carries heartbeats."""
        client = self.stack.redis_client()
        queues = [fault.target] + (["control"] if fault.target != "control" else [])
        for queue in queues:
            popped = client.brpop([queue], timeout=MESSAGE_WINDOW_S)
            if popped is None:
                continue
            raw = popped[1]
            if fault.kind == "drop_message":
                return f"dropped from {queue}: {describe_message(raw)}"
            client.rpush(queue, raw, raw)
            return f"duplicated on {queue}: {describe_message(raw)}"
        return f"no message on {' or '.join(queues)} within {MESSAGE_WINDOW_S:.0f} s each"


def describe_message(raw: bytes) -> str:
    """A Celery message on Redis, in a few words: task name and what the payload says."""
    try:
        envelope = json.loads(raw)
        task = envelope.get("headers", {}).get("task", "?")
        body = json.loads(base64.b64decode(envelope["body"]))
        args = body[0] if isinstance(body, list) and body else []
        payload = args[0] if args and isinstance(args[0], dict) else {}
    except (ValueError, KeyError, TypeError):
        return f"{len(raw)} bytes (not a Celery message)"
    words = [task]
    for key in ("type", "node", "job_id", "attempt", "seq", "outcome"):
        if key in payload:
            words.append(f"{key}={payload[key]}")
    return " ".join(str(word) for word in words)
