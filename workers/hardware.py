"""Inventory that follows the hardware: when the agent reads its GPUs again, and why.

The agent reads its inventory (workers.inventory) again, without a restart:

- on SIGHUP (`install_sighup`; Celery's own SIGHUP handler, which would re-exec the worker,
  is replaced). An operator sends it after changing the MIG layout (`nvidia-smi mig ...`) or
  resetting a GPU: it also forgets the GPUs taken out for a critical Xid error;
- every PORTAL_AGENT_INVENTORY_S (300 s by default);
- at once when a critical Xid error is reported (`XidWatch`, polled every heartbeat without
  blocking) or a GPU sample failed (a GPU that fell off the bus answers GPU_IS_LOST).

A re-read uses the source the agent started with (NVML, or the described inventory, whose
file is read again). If it fails (NVML refuses, a description that is no longer valid), the
last inventory stays and the error is logged: the agent never offers guessed GPUs.
What the agent does with the result (stop the attempts on slices that are gone, refuse
launches onto them, report the new inventory at once) is `Agent.refresh_inventory`.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from workers.inventory import GPU_LOST, XidWatch
from workers.protocol import Inventory

log = logging.getLogger("workers.hardware")

Reader = Callable[[Inventory, Mapping[str, str]], Inventory]
DEFAULT_INVENTORY_S = 300.0


class HardwareWatch:
    """When the inventory is due to be read again (`due`), the GPUs a critical Xid error
    took out of service (`unhealthy`: UUID -> why) and the read itself (`reread`)."""

    def __init__(
        self,
        read: Reader,
        *,
        every_s: float = DEFAULT_INVENTORY_S,
        xid: XidWatch | None = None,
        clock: Callable[[], float],
    ) -> None:
        self._read = read
        self.every_s = every_s
        self.xid = xid
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at = clock()
        self._asked: str | None = None
        self._forget_unhealthy = False
        self.unhealthy: dict[str, str] = {}
        self.wake = threading.Event()  # set when a re-read is asked for (the heartbeat waits)

    def request(self, why: str, *, forget_unhealthy: bool = False) -> None:
        """Read the inventory again at the next round (the heartbeat thread is woken)."""
        with self._lock:
            self._asked = self._asked or why
            self._forget_unhealthy = self._forget_unhealthy or forget_unhealthy
        self.wake.set()

    def on_sighup(self, signum: int, frame: FrameType | None) -> None:
        """SIGHUP: an operator's re-read, which also forgets the Xid marks (GPU reset)."""
        self.request("SIGHUP", forget_unhealthy=True)

    def poll_xid(self) -> bool:
        """Read NVML's pending Xid events; True when one took a GPU out of service."""
        if self.xid is None:
            return False
        found = False
        for uuid, xid in self.xid.poll():
            log.error("critical Xid %d reported by NVML on %s", xid, uuid or "a GPU")
            if uuid:
                with self._lock:
                    if uuid not in self.unhealthy:
                        self.unhealthy[uuid] = (
                            f"{GPU_LOST}: NVML reported critical Xid {xid} on {uuid}; taken out "
                            "until the agent's next SIGHUP or restart (reset the GPU first)"
                        )
            found = True
        if found:
            self.request("Xid error")
        return found

    def due(self) -> str | None:
        """Why the inventory is to be read now (a request, or every_s since the last read)."""
        with self._lock:
            if self._asked is not None:
                return self._asked
        if self._clock() - self._read_at >= self.every_s:
            return f"every {self.every_s:g} s"
        return None

    def reread(self, current: Inventory) -> Inventory | None:
        """The inventory read again, or None (logged) when the read failed."""
        with self._lock:
            self._asked = None
            if self._forget_unhealthy:
                if self.unhealthy:
                    log.warning("forgetting the Xid marks of %s", ", ".join(sorted(self.unhealthy)))
                self.unhealthy.clear()
                self._forget_unhealthy = False
            unhealthy = dict(self.unhealthy)
            self._read_at = self._clock()
        try:
            new = self._read(current, unhealthy)
        except Exception as error:  # InventoryError, NVMLError, a file gone: keep the last
            log.error("inventory not read again (the last one stays): %s", error)
            return None
        if self.xid is not None:
            self.xid.register(new)
        return new


def install_sighup(watch: HardwareWatch) -> None:
    """Make SIGHUP a re-read of the inventory (main thread only)."""
    signal.signal(signal.SIGHUP, watch.on_sighup)


def keep_sighup_for(worker: Any, watch: HardwareWatch) -> None:
    """Celery's worker installs its SIGHUP handler (a re-exec of the whole process) when it
    starts; the agent's goes in right after, so SIGHUP re-reads the inventory instead."""
    tweaks = worker.install_platform_tweaks

    def install(target: Any) -> None:
        tweaks(target)
        install_sighup(watch)

    worker.install_platform_tweaks = install
