"""The GPU host agent: a Celery worker on its node's queue, plus heartbeat and lease threads.

    python -m workers          # or: python -m workers.agent

1. Read and validate the settings (a bad variable: one line naming it, exit code 2), take
   the work directory's lock (a second agent on it exits with code 2).
2. Discover the inventory (NVML, else described) and prepare the MPS directories/daemons,
   watched from then on by their own thread (workers.mps).
3. Recover: reports still in the outbox are sent again; attempts the journal says were running
   are adopted again (containers) or reported `lost` (processes die with their agent). With
   the docker launcher the container watchdog (workers.watchdog) is made sure of first: it
   kills the node's containers once the lease lapses, even while the agent is frozen or dead.
4. Heartbeats every PORTAL_AGENT_HEARTBEAT_S; the portal acknowledges each one it accepts
   (`ack`), and each acknowledgement renews the lease: the agent may run jobs until the
   acknowledged heartbeat's send time + PORTAL_AGENT_FENCE_FRACTION x the portal's lease. It
   launches nothing before its first acknowledged heartbeat, and when the lease lapses it stops
   every job itself (`fenced`) — before the portal, which waits the full lease, requeues them.
   The lease is also written to `<workdir>/lease.json`, which each job's own watcher reads,
   so the jobs stop in time even when the agent process is frozen.
5. Consume only `node.<name>`: `agent.launch` (a `launch`, or a `launches` batch of them),
   `agent.stop`, `agent.query` and `agent.ack`, one signed envelope each (workers.signing).
   Tasks ack late, prefetch one, run on a thread pool, and return at once: supervision of an
   attempt lives on its own thread.
6. The inventory follows the hardware (workers.hardware): read again on SIGHUP, every
   PORTAL_AGENT_INVENTORY_S, on a critical Xid error and when a GPU sample fails. Attempts on
   slices that are gone are stopped and reported `lost` with the reason (GPU_LOST: ...,
   MIG_RECONFIGURED: ...), launches onto them are refused the same way, and a heartbeat with
   the new inventory goes out at once.
7. On SIGTERM/SIGINT Celery shuts down warm; then the agent stops its jobs (reported as
   preempted, so the portal requeues them), stops its MPS daemons and exits.

Reports (`started`, `log`, `finished`) are written to the outbox before they are sent, go
out in `reports` batches (what piled up while the last batch was on its way goes together)
and are re-sent every PORTAL_AGENT_RESEND_S until acknowledged. The agent never imports the
portal.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import (  # type: ignore[import-untyped]
    after_setup_logger,
    worker_shutting_down,
)
from kombu.entity import Queue

from workers.hardware import HardwareWatch, keep_sighup_for
from workers.inventory import (
    InventoryError,
    XidWatch,
    discover,
    open_nvml,
    slice_gone_reason,
    slices_gone,
)
from workers.launch import SliceGone
from workers.launchers import Launcher, Run
from workers.launchers.process import process_launcher
from workers.lease import Lease, lease_path, write_lease
from workers.metrics import MetricsBatch, NvmlSampler
from workers.mps import CONTROL_BINARY, MpsSupervisor
from workers.outbox import AttemptJournal, Outbox, report_id
from workers.protocol import (
    CONTROL_QUEUE,
    LEASE_QUEUE,
    TASK_ACK,
    TASK_AGENT_REPORT,
    TASK_LAUNCH,
    TASK_QUERY,
    TASK_STOP,
    TO_AGENT_TYPES,
    Ack,
    Heartbeat,
    Inventory,
    Launch,
    Launches,
    Message,
    Metrics,
    Query,
    Report,
    Reports,
    Stop,
    node_queue,
    report_batches,
)
from workers.settings import AgentSettings, SettingsError
from workers.signing import (
    DEFAULT_MAX_SKEW_S,
    ReplayGuard,
    SignatureError,
    check_fresh,
    message_of,
    open_envelope,
    seal,
    verify_signature,
)
from workers.supervisor import Supervisor

log = logging.getLogger("workers.agent")

try:
    AGENT_VERSION = metadata.version("gpu-portal")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    AGENT_VERSION = "0.0.0+source"

Send = Callable[[Message], None]
# A heartbeat lists at most this many unacknowledged `finished` reports (the rest follow).
HEARTBEAT_FINISHED_MAX = 500
# Reports re-sent per resend round at most (the rest wait for the next round).
RESEND_BATCH = 2_000
# A report still unacknowledged is sent again after resend_s, then after twice as long each
# time, up to this: a control plane that is slow (a backlog) is not buried under copies of
# what it has not yet read, which would only lengthen the backlog.
RESEND_MAX_S = 60.0
# Ended attempts stay in the journal this long (longer than any message may live).
JOURNAL_KEEP_S = 4 * DEFAULT_MAX_SKEW_S
JOURNAL_PRUNE_EVERY_S = 60.0


class CelerySender:
    """Signs a message with the node's key and sends it to the control plane's
    `portal.agent_report` task; raises when the broker cannot take it."""

    def __init__(self, app: Celery, *, node: str, key: bytes) -> None:
        self._app = app
        self._node = node
        self._key = key
        self._lock = threading.Lock()  # supervision, heartbeat and resend threads share it

    def __call__(self, message: Message) -> None:
        envelope = seal(message, node=self._node, key=self._key, now=time.time())
        queue = LEASE_QUEUE if isinstance(message, Heartbeat) else CONTROL_QUEUE
        with self._lock:
            self._app.send_task(TASK_AGENT_REPORT, args=[envelope], queue=queue, retry=False)


class LeaseKeeper:
    """The agent's lease as the portal's acknowledgements grant it.

    Renewed only by an `ack` of one of this run's heartbeats: valid until that heartbeat's
    send time (the agent's clock) + fraction x the portal's lease. Since the portal receives
    the heartbeat after it was sent and waits the full lease before it requeues, the agent's
    deadline always comes first.
    """

    def __init__(
        self, *, boot: str, fraction: float, path: Path | None, clock: Callable[[], float]
    ) -> None:
        self.boot = boot
        self.fraction = fraction
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._sent: OrderedDict[int, float] = OrderedDict()
        self.valid_until = 0.0
        self.lease_s: float | None = None
        self.fenced_at: float | None = None
        # Times the lease was held again after it ran out (workers.lease: a launch accepted
        # in an earlier epoch never starts).
        self.epoch = 0
        self._unfenced_lapse = False  # it ran out and was renewed before a fence saw it

    def sent(self, seq: int, at: float) -> None:
        with self._lock:
            self._sent[seq] = at
            while len(self._sent) > 1_000:
                self._sent.popitem(last=False)

    def acknowledged(self, *, boot: str, seq: int, lease_s: float) -> bool:
        """Renew from the ack of heartbeat `seq`; False when it is not one of ours."""
        with self._lock:
            sent_at = self._sent.get(seq)
            if boot != self.boot or sent_at is None:
                return False
            until = sent_at + self.fraction * lease_s
            self.lease_s = lease_s
            if until <= self.valid_until:
                return True
            now = self._clock()
            if self.valid_until != 0.0 and self.valid_until <= now < until:
                # Held again after it ran out: a new epoch. A lapse no fence saw yet (this ack
                # came first) is still fenced: the portal may have requeued those attempts.
                self.epoch += 1
                if self.fenced_at is None:
                    self._unfenced_lapse = True
            self.valid_until = until
            if self.fenced_at is not None and until > now:
                log.info("lease regained: launches accepted again")
                self.fenced_at = None
            if self.path is not None:
                # Under the lock, so a slower writer never puts back an older deadline.
                write_lease(self.path, Lease(valid_until=until, boot=self.boot, epoch=self.epoch))
        return True

    def held(self) -> bool:
        return self._clock() < self.valid_until

    def held_epoch(self) -> int | None:
        """The epoch while the lease is held (None when it is not: nothing may launch)."""
        with self._lock:
            return self.epoch if self._clock() < self.valid_until else None

    def lapsed_now(self) -> bool:
        """True once, when a held lease has just run out (time to fence), or ran out and was
        renewed before a fence saw it."""
        with self._lock:
            if self._unfenced_lapse:
                self._unfenced_lapse = False
                return True
            if self.valid_until == 0.0 or self.fenced_at is not None:
                return False
            if self._clock() < self.valid_until:
                return False
            self.fenced_at = self._clock()
            return True


class Agent:
    def __init__(
        self,
        *,
        node: str,
        inventory: Inventory,
        launcher: Launcher,
        send: Send,
        workdir: Path,
        key: bytes,
        kill_grace_s: float = 10.0,
        fence_fraction: float = 0.5,
        fence_grace_s: float = 2.0,
        resend_s: float = 5.0,
        max_skew_s: float = DEFAULT_MAX_SKEW_S,
        outbox_log_bytes: int = 64 * 1024 * 1024,
        sampler: NvmlSampler | None = None,
        metrics_s: float = 30.0,
        metrics_batch_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        boot: str | None = None,
        previous_boot: str = "",
        write_lease_file: bool = True,
        mps: MpsSupervisor | None = None,
        address: str = "",
        hardware: HardwareWatch | None = None,
    ) -> None:
        self.node = node
        # Where other hosts reach this one, told in every heartbeat (a gang's MASTER_ADDR).
        self.address = address
        self.inventory = inventory
        # When the inventory is read again (workers.hardware); None: never.
        self.hardware = hardware
        self._inventory_lock = threading.Lock()
        self.kill_grace_s = kill_grace_s
        self.workdir = workdir
        self._send = send
        self._key = key
        self._clock = clock
        self._sampler = sampler
        # GPU samples (workers.metrics): taken every metrics_s, shipped every metrics_batch_s.
        self.metrics_s = metrics_s
        self.metrics_batch_s = metrics_batch_s
        self.metrics = MetricsBatch()
        self._sampled_at = float("-inf")
        self._max_skew_s = max_skew_s
        self._replays = ReplayGuard(window_s=2 * max_skew_s)
        self.resend_s = resend_s
        self.fence_grace_s = fence_grace_s
        self.boot = boot or uuid.uuid4().hex
        self.previous_boot = previous_boot
        self.outbox = Outbox(workdir / "outbox", max_log_bytes=outbox_log_bytes)
        self.journal = AttemptJournal(workdir / "attempts")
        self.lease = LeaseKeeper(
            boot=self.boot,
            fraction=fence_fraction,
            path=lease_path(workdir) if write_lease_file else None,
            clock=clock,
        )
        # MPS daemons, watched on their own thread; every launch passes their rules first.
        self.mps = mps
        self.supervisor = Supervisor(
            node=node,
            launcher=self._gated(mps.watch(launcher) if mps is not None else launcher),
            report=self.report,
            journal=self.journal,
            kill_grace_s=kill_grace_s,
            clock=clock,
            lease_epoch=self.lease.held_epoch,
            slice_gone=self.slice_gone,
        )
        self._heartbeat_seq = 0
        self._pruned_at = float("-inf")
        # Per unacknowledged report: when it was last sent, and how many times so far.
        self._last_sent: dict[tuple[str, int, int, int], tuple[float, int]] = {}
        self._send_lock = threading.Lock()
        # Reports put in the outbox and not yet sent, and whether a thread is sending: the
        # reports that arrive while one batch is on its way go together in the next one.
        self._unsent: list[Report] = []
        self._sending = False
        self._unsent_lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.refused: list[str] = []  # why incoming messages were refused (also logged)

    # --- incoming (the agent's Celery tasks) ------------------------------------------------

    def handle(self, payload: Any) -> None:
        """Verify and dispatch one signed envelope from the portal. A message that fails is
        refused and logged with the reason; retrying could not make it valid."""
        message = self._verified(payload)
        if isinstance(message, Launch):
            self.supervisor.launch(message)
        elif isinstance(message, Launches):
            for launch in message.launches:
                self.supervisor.launch(launch)
        elif isinstance(message, Stop):
            self.supervisor.stop(message)
        elif isinstance(message, Query):
            self.supervisor.query(message)
        elif isinstance(message, Ack):
            self.handle_ack(message)

    def _verified(self, payload: Any) -> Message | None:
        try:
            envelope = open_envelope(payload)
            if envelope.node != self.node:
                raise SignatureError(
                    "wrong_node", f"addressed to {envelope.node!r}, this is {self.node!r}"
                )
            verify_signature(envelope, self._key)
            now = self._clock()
            check_fresh(envelope, now=now, max_skew_s=self._max_skew_s)
            if not self._replays.first_time(envelope.nonce, now=now):
                raise SignatureError("replay", f"nonce {envelope.nonce} was seen already")
            return message_of(envelope, allowed_types=TO_AGENT_TYPES)
        except SignatureError as error:
            self.refused.append(error.reason)
            log.error("refused a message: %s", error)
            return None

    def handle_ack(self, ack: Ack) -> None:
        removed = self.outbox.ack(ack.reports)
        if removed:
            with self._send_lock:
                for key in ack.reports:
                    self._last_sent.pop(key.as_tuple(), None)
        if (
            ack.heartbeat_seq is not None
            and ack.lease_s is not None
            and not self.lease.acknowledged(
                boot=ack.boot, seq=ack.heartbeat_seq, lease_s=ack.lease_s
            )
        ):
            log.warning("ack of heartbeat %s of run %s is not ours", ack.heartbeat_seq, ack.boot)

    # --- outgoing -----------------------------------------------------------------------------

    def report(self, message: Report) -> bool:
        """Keep a report in the outbox and send it; False when the outbox refused it (a log
        chunk past the bound).

        Reports go out as `reports` batches. A report made while another thread's batch is on
        its way to the broker waits for the next batch, which that thread sends as soon as its
        own went: one broker round trip, and one transaction on the portal, for every report
        that piled up meanwhile. When no other send is under way this thread sends its report
        at once, alone in its batch."""
        if not self.outbox.put(message):
            return False
        with self._unsent_lock:
            self._unsent.append(message)
            if self._sending:
                return True  # the sending thread takes it with its next batch
            self._sending = True
        try:
            while True:
                with self._unsent_lock:
                    waiting, self._unsent = self._unsent, []
                    if not waiting:
                        self._sending = False
                        return True
                for batch in report_batches(self.node, waiting):
                    # A batch the broker does not take stays in the outbox for a resend.
                    self._transmit(batch)
        except BaseException:
            with self._unsent_lock:
                self._sending = False
            raise

    def _transmit(self, message: Message) -> bool:
        try:
            self._send(message)
        except Exception as error:  # any broker failure: the outbox keeps it for a resend
            log.warning("could not send %s (kept for a resend): %s", message.TYPE, error)
            return False
        if isinstance(message, Reports):  # heartbeats and metrics are never re-sent
            now = time.monotonic()
            with self._send_lock:
                for report in message.reports:
                    rid = report_id(report)
                    _, times = self._last_sent.get(rid, (0.0, 0))
                    self._last_sent[rid] = (now, times + 1)
        return True

    def resend_due(self, rid: tuple[str, int, int, int], now: float) -> bool:
        """Whether an unacknowledged report is due again: resend_s after its first send,
        then twice as long after each resend, up to RESEND_MAX_S."""
        with self._send_lock:
            sent = self._last_sent.get(rid)
        if sent is None:
            return True
        last, times = sent
        backoff: float = self.resend_s * 2.0 ** max(0, times - 1)
        wait = min(backoff, max(self.resend_s, RESEND_MAX_S))
        return now - last >= wait

    def resend_pending(self) -> int:
        """Send again every unacknowledged report that is due (see `resend_due`), in
        `reports` batches; returns how many reports went."""
        now = time.monotonic()
        due = [r for r in self.outbox.pending() if self.resend_due(report_id(r), now)]
        sent = 0
        for batch in report_batches(self.node, due[:RESEND_BATCH]):
            if not self._transmit(batch):
                break  # the broker is away: the next round tries again
            sent += len(batch.reports)
        return sent

    def heartbeat(self) -> Heartbeat:
        self._heartbeat_seq += 1
        sent_at = self._clock()
        self.lease.sent(self._heartbeat_seq, sent_at)
        return Heartbeat(
            node=self.node,
            boot=self.boot,
            address=self.address,
            previous_boot=self.previous_boot,
            seq=self._heartbeat_seq,
            agent_version=AGENT_VERSION,
            sent_at=sent_at,
            inventory=self.inventory,
            running=tuple(self.supervisor.running()),
            finished=tuple(self.outbox.pending_finished()[:HEARTBEAT_FINISHED_MAX]),
            launch_batches=True,
        )

    # --- the inventory, following the hardware (workers.hardware) ----------------------------

    def _gated(self, launcher: Launcher) -> Launcher:
        """With an inventory that can change, a launch onto a slice that is not in it any more
        is refused (`InventoryGate`); without, the inventory is the one the portal placed on."""
        if self.hardware is None:
            return launcher
        return InventoryGate(launcher, lambda: self.inventory)

    def check_hardware(self) -> dict[str, str]:
        """Poll NVML's Xid events, and read the inventory again when that is due; returns the
        slices that went (slice key -> why)."""
        hardware = self.hardware
        if hardware is None:
            return {}
        hardware.poll_xid()
        why = hardware.due()
        return {} if why is None else self.refresh_inventory(why)

    def refresh_inventory(self, why: str) -> dict[str, str]:
        """Read the inventory again (`why`: what asked for it); stop the attempts on slices
        that are gone. Returns those slices (slice key -> why they went)."""
        hardware = self.hardware
        if hardware is None:
            return {}
        with self._inventory_lock:
            old = self.inventory
            new = hardware.reread(old)
            if new is None or new == old:
                return {}
            gone = slices_gone(old, new)
            self.inventory = new
        added = sorted(set(new.slice_keys()) - set(old.slice_keys()))
        log.warning(
            "inventory read again (%s): %d GPU(s), %d lost; %d slice(s) gone, %d new",
            why,
            len(new.gpus),
            len(new.lost),
            len(gone),
            len(added),
        )
        for key, reason in sorted(gone.items()):
            log.warning("slice %s is gone: %s", key, reason)
        if gone:
            stopped = self.supervisor.lose_slices(gone, self.kill_grace_s)
            if stopped:
                log.error(
                    "stopping %d attempt(s) on slices that are gone: %s", len(stopped), stopped
                )
        return gone

    def slice_gone(self, launch: Launch) -> str | None:
        """Why one of the launch's slices is not in the inventory (read again first, outside
        any lock of the supervisor's), or None when all are there. Asked when an attempt exits
        with an error: did its GPU go under it?"""
        if self.hardware is None:
            return None
        self.refresh_inventory("an attempt exited with an error")
        return missing_slice(launch, self.inventory)

    def beat(self) -> None:
        """The inventory if it is due, one heartbeat, the resend of unacknowledged reports,
        then GPU metrics."""
        try:
            self.check_hardware()
        except Exception:
            log.exception("inventory check failed")
        self._transmit(self.heartbeat())
        self.resend_pending()
        self.sample_metrics()
        self.ship_metrics()
        now = self._clock()
        if now - self._pruned_at >= JOURNAL_PRUNE_EVERY_S:
            # The journal holds up to thousands of entries: not on every heartbeat.
            self._pruned_at = now
            self.journal.prune(
                now=now,
                keep_s=JOURNAL_KEEP_S,
                keep={(r.job_id, r.attempt) for r in self.outbox.pending()},
            )

    def check_lease(self) -> None:
        """Fence: the lease just ran out, so stop every job before the portal requeues it."""
        if self.lease.lapsed_now():
            stopped = self.supervisor.fence(
                f"no acknowledged heartbeat: the lease ran out at {self.lease.valid_until:.3f}",
                self.fence_grace_s,
            )
            log.error(
                "lease lapsed (no acknowledged heartbeat): fenced %d running attempt(s)", stopped
            )

    def sample_metrics(self) -> int:
        """Read the GPUs and the running attempts once metrics_s has passed since the last
        reading (workers.metrics); returns the samples taken."""
        now = self._clock()
        if self._sampler is None or now - self._sampled_at < self.metrics_s:
            return 0
        self._sampled_at = now
        try:
            devices, attempts = self._sampler.sample(
                inventory=self.inventory, running=self.supervisor.running_launches(), at=now
            )
        except Exception:
            log.exception("GPU metrics not sampled")
            return 0
        self.metrics.add(devices, attempts)
        failed = [d.uuid for d in devices if d.error]
        if failed and self.hardware is not None:
            # GPU_IS_LOST and the like: read the inventory again at the next heartbeat.
            self.hardware.request(f"samples of {', '.join(failed)} failed")
        return len(devices) + len(attempts)

    def ship_metrics(self, *, force: bool = False) -> int:
        """Send the samples taken, in messages of at most METRICS_MAX_SAMPLES, once the
        oldest is metrics_batch_s old (or at once with `force`); a batch the broker does not
        take waits for the next round. Returns the messages sent."""
        oldest = self.metrics.oldest()
        if oldest is None or (not force and self._clock() - oldest < self.metrics_batch_s):
            return 0
        sent = 0
        while len(self.metrics):
            devices, attempts = self.metrics.take()
            message = Metrics(node=self.node, devices=tuple(devices), attempts=tuple(attempts))
            if not self._transmit(message):
                self.metrics.restore(devices, attempts)
                break
            sent += 1
        return sent

    def start(self, heartbeat_s: float) -> None:
        """The heartbeat thread, the lease watcher and, with MPS daemons, their watcher."""

        # A re-read asked for (SIGHUP, an Xid error) wakes the heartbeat thread: the portal
        # hears of the new inventory at once, not a heartbeat later.
        wake = self.hardware.wake if self.hardware is not None else self._stopping

        def beats() -> None:
            while not self._stopping.is_set():
                wake.clear()
                try:
                    self.beat()
                except Exception:
                    log.exception("heartbeat round failed")
                wake.wait(heartbeat_s)

        def lease_watch() -> None:
            while not self._stopping.is_set():
                try:
                    self.check_lease()
                except Exception:
                    log.exception("lease check failed")
                self._stopping.wait(0.2)

        threads: list[tuple[str, Callable[[], None]]] = [
            ("heartbeat", beats),
            ("lease", lease_watch),
        ]
        mps = self.mps
        if mps is not None and mps.supervised:
            # Every heartbeat period, on a thread of its own: a hung daemon's check (up to its
            # timeout) never delays a heartbeat.
            stopping = self._stopping
            threads.append(("mps", lambda: mps.run_forever(stopping)))
        for name, target in threads:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, grace_s: float | None = None) -> None:
        """Stop the jobs and the threads; one last heartbeat tells the portal what is left."""
        self.supervisor.shutdown(grace_s)
        self._stopping.set()
        if self.hardware is not None:
            self.hardware.wake.set()
        for thread in self._threads:
            thread.join(5)
        self._transmit(self.heartbeat())
        self.resend_pending()
        self.ship_metrics(force=True)


def missing_slice(launch: Launch, inventory: Inventory) -> str | None:
    """Why one of the launch's slices is not offered by `inventory`, or None."""
    offered = inventory.slice_keys()
    for device in launch.devices:
        if device.slice_id not in offered:
            return slice_gone_reason(
                device.gpu_uuid, device.gpu_index, inventory, was_mig=device.kind == "mig"
            )
    return None


class InventoryGate:
    """The agent's launcher, refusing a launch onto a slice that is not in the node's
    inventory now (`SliceGone`: reported `lost`, so the portal requeues it)."""

    def __init__(self, inner: Launcher, inventory: Callable[[], Inventory]) -> None:
        self.inner = inner
        self.name = inner.name
        self._inventory = inventory

    def start(self, launch: Launch, *, lease_epoch: int | None = None) -> Run:
        why = missing_slice(launch, self._inventory())
        if why is not None:
            raise SliceGone(why)
        return self.inner.start(launch, lease_epoch=lease_epoch)


# --- the process ------------------------------------------------------------------------------


def make_celery_app(broker_url: str, node: str) -> Celery:
    # No fixups: Celery's Django fixup would set the portal up inside the agent whenever
    # DJANGO_SETTINGS_MODULE is in its environment (the agent never loads the portal).
    app = Celery("portal-agent", broker=broker_url, set_as_current=False, fixups=[])
    queue = node_queue(node)
    app.conf.update(
        task_queues=[Queue(queue, routing_key=queue)],  # type: ignore[no-untyped-call]
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        # A send must fail fast when the broker is away: the outbox keeps the report.
        broker_transport_options={"socket_timeout": 3, "socket_connect_timeout": 3},
        worker_hijack_root_logger=False,
    )
    return app


def register_tasks(app: Celery, agent: Agent) -> None:
    for name in (TASK_LAUNCH, TASK_STOP, TASK_QUERY, TASK_ACK):
        app.task(name=name, acks_late=True, ignore_result=True)(agent.handle)


def build_launcher(settings: AgentSettings) -> Launcher:
    if settings.launcher == "docker":
        from docker.errors import DockerException  # type: ignore[import-untyped]

        from workers.launchers.docker import DockerLauncher

        try:
            return DockerLauncher(
                node=settings.node,
                mps_root=settings.mps_root,
                # Fence markers (the watchdog's) and the jobs' scratch directories.
                workdir=settings.workdir,
                policy=settings.container_policy,
            )
        except DockerException as exc:
            raise SettingsError(
                f"PORTAL_AGENT_LAUNCHER: docker was chosen but the engine is unreachable: {exc}"
            ) from None
    return process_launcher(settings)


class WorkdirLock:
    """One agent per work directory: a second one on the same directory would run the same
    attempts' files and outbox."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.path = workdir / "agent.lock"
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        handle = open(self.path, "a+")  # noqa: SIM115 - held for the agent's lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise SettingsError(
                f"PORTAL_AGENT_WORKDIR: {self.path.parent} is in use by another agent ({holder})"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._file = handle


def next_boot(workdir: Path) -> tuple[str, str]:
    """(this run's id, the previous run's id on this work directory, or "")."""
    path = workdir / "boot"
    previous = ""
    with contextlib.suppress(OSError):
        previous = path.read_text().strip()
    boot = uuid.uuid4().hex
    path.write_text(boot + "\n")
    return boot, previous


def adopt_runs(launcher: Launcher, journal: AttemptJournal) -> dict[tuple[int, int], Run]:
    """What survived the previous run of the agent: adopted containers; leftover processes
    (which should have died with it) are killed, and processes that ended on their own
    before anyone read their status hand over the exit code their shim recorded."""
    adopt = getattr(launcher, "adopt", None)
    if callable(adopt):
        return dict(adopt())
    reap = getattr(launcher, "reap_leftovers", None)
    if callable(reap):
        killed = reap(set())
        if killed:
            log.warning("killed leftovers of an earlier agent run: %s", killed)
    ended = getattr(launcher, "ended_runs", None)
    if callable(ended):
        return dict(ended((e.job_id, e.attempt) for e in journal.unfinished()))
    return {}


def quiet_task_lines() -> None:
    """One log line per received task (an ack every heartbeat) would drown what matters; the
    worker sets its loggers up when it starts, so this runs again then."""

    def quiet(**_: Any) -> None:
        for chatty in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(chatty).setLevel(logging.WARNING)

    quiet()
    after_setup_logger.connect(quiet, weak=False)


def inventory_reader(
    settings: AgentSettings, driver: str, nvml: Any
) -> Callable[[Inventory, Mapping[str, str]], Inventory]:
    """How the agent reads its inventory again: from the source it started with (NVML, or
    the description, read again), never falling back from NVML to a described one."""

    def read(previous: Inventory, unhealthy: Mapping[str, str]) -> Inventory:
        return discover(
            settings.node,
            source="nvml" if driver == "nvml" else "described",
            description=settings.inventory,
            mps_shares=settings.mps_shares,
            nvml=nvml,
            previous=previous,
            unhealthy=unhealthy,
        )

    return read


def main(environ: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet_task_lines()
    env = os.environ if environ is None else environ
    try:
        settings = AgentSettings.from_env(env)
        WorkdirLock(settings.workdir).acquire()
        inventory = discover(
            settings.node,
            source=settings.gpu_source,
            description=settings.inventory,
            mps_shares=settings.mps_shares,
        )
        launcher = build_launcher(settings)
    except (SettingsError, InventoryError) as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    mps = MpsSupervisor(
        inventory,
        settings.mps_root,
        binary=shutil.which(CONTROL_BINARY) if inventory.driver == "nvml" else None,
        check_every_s=settings.heartbeat_s,
        kill_grace_s=settings.kill_grace_s,
    )
    mps.prepare()
    nvml, _ = open_nvml() if inventory.driver == "nvml" else (None, "")
    hardware = HardwareWatch(
        inventory_reader(settings, inventory.driver, nvml),
        every_s=settings.inventory_s,
        xid=XidWatch(nvml) if nvml is not None else None,
        clock=time.time,
    )
    if hardware.xid is not None:
        hardware.xid.register(inventory)
    app = make_celery_app(settings.broker_url, settings.node)
    boot, previous_boot = next_boot(settings.workdir)
    agent = Agent(
        node=settings.node,
        inventory=inventory,
        launcher=launcher,
        send=CelerySender(app, node=settings.node, key=settings.key),
        workdir=settings.workdir,
        key=settings.key,
        kill_grace_s=settings.kill_grace_s,
        fence_fraction=settings.fence_fraction,
        fence_grace_s=settings.fence_grace_s,
        resend_s=settings.resend_s,
        max_skew_s=settings.max_skew_s,
        outbox_log_bytes=settings.outbox_log_bytes,
        sampler=NvmlSampler(nvml) if nvml is not None else None,
        metrics_s=settings.metrics_s,
        metrics_batch_s=settings.metrics_batch_s,
        boot=boot,
        previous_boot=previous_boot,
        mps=mps,
        address=settings.address,
        hardware=hardware,
    )
    if settings.launcher == "docker":
        # Containers outlive the agent: before any is adopted or started, make sure the
        # watchdog that kills them once the lease lapses runs (or finds its service running).
        from workers.watchdog import ensure_watchdog

        ensure_watchdog(workdir=settings.workdir, node=settings.node)
    agent.supervisor.recover(mps.adopted(adopt_runs(launcher, agent.journal), agent.journal))
    register_tasks(app, agent)
    log.info(
        "agent %s (run %s, address %s): %d GPUs (%s), launcher %s, queue %s, %d report(s) in "
        "the outbox",
        settings.node,
        boot,
        settings.address,
        len(inventory.gpus),
        inventory.driver,
        launcher.name,
        node_queue(settings.node),
        len(agent.outbox),
    )
    agent.start(settings.heartbeat_s)
    worker = app.Worker(
        queues=[node_queue(settings.node)],
        pool="threads",
        concurrency=settings.concurrency,
        hostname=f"agent@{settings.node}",
        loglevel="INFO",
        without_gossip=True,
        without_mingle=True,
    )
    keep_sighup_for(worker, hardware)
    stopped_by: list[str] = []
    worker_shutting_down.connect(lambda sig, **_: stopped_by.append(sig), weak=False)
    try:
        worker.start()
    finally:
        agent.close()
        mps.stop()
        if hardware.xid is not None:
            hardware.xid.close()
        if nvml is not None:
            nvml.nvmlShutdown()
    # Celery exits 1 after a Ctrl-C; for the agent SIGINT and SIGTERM are both a clean stop.
    if stopped_by and stopped_by[0] in ("SIGINT", "SIGTERM"):
        return 0
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
