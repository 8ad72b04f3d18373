"""A process coalesces its 'schedule now' requests: the first at once, the rest of a window
as one send at its end (portal/passes.py)."""

from __future__ import annotations

import os
import threading
import time

from portal.passes import Coalescer


class Sends:
    def __init__(self) -> None:
        self.count = 0
        self.sent = threading.Event()
        self.threads: list[threading.Thread] = []  # kept: an ended thread's ident is reused

    def __call__(self) -> None:
        self.count += 1
        self.threads.append(threading.current_thread())
        self.sent.set()


def test_the_first_request_is_sent_at_once_and_a_burst_after_it_as_one_send_at_the_end():
    sends = Sends()
    # The decisions read this clock (it stands still: the burst is within the window
    # however slowly the machine runs); the timer waits for real.
    coalescer = Coalescer(sends, window=lambda: 0.2, clock=lambda: 100.0)

    coalescer.ask()
    assert sends.count == 1
    sends.sent.clear()
    began = time.monotonic()
    for _ in range(50):
        coalescer.ask()
    assert sends.count == 1  # the burst waits for the window's end

    assert sends.sent.wait(timeout=10)
    assert time.monotonic() - began >= 0.2
    time.sleep(0.3)  # no other send follows: one for the whole burst
    assert sends.count == 2


def test_a_request_after_a_quiet_window_is_sent_at_once():
    now = [100.0]
    sends = Sends()
    coalescer = Coalescer(sends, window=lambda: 0.05, clock=lambda: now[0])

    coalescer.ask()
    now[0] += 0.06
    coalescer.ask()

    assert sends.count == 2


def test_a_window_of_0_sends_every_request_at_once():
    sends = Sends()
    coalescer = Coalescer(sends, window=lambda: 0.0)
    for _ in range(5):
        coalescer.ask()
    assert sends.count == 5


def test_the_late_sends_of_every_window_come_from_one_thread():
    # A thread per window rebuilt Celery's per-thread result backend at each send.
    sends = Sends()
    coalescer = Coalescer(sends, window=lambda: 0.05)
    for _ in range(3):
        coalescer.ask()  # at once, or late when a window is still open
        coalescer.ask()  # late: at the window's end
        assert sends.sent.wait(timeout=10)
        sends.sent.clear()
        time.sleep(0.12)  # the late send is made and its window has closed
    late = [thread for thread in sends.threads if thread is not threading.current_thread()]
    assert len(late) >= 3
    assert len({id(thread) for thread in late}) == 1


def test_a_process_forked_with_a_send_due_sends_its_own_requests():
    # The parent's late send is due (its sender thread waits); the child has no such thread.
    parent_sends = Sends()
    coalescer = Coalescer(parent_sends, window=lambda: 5.0)
    coalescer.ask()  # sent at once
    coalescer.ask()  # due at the window's end, on the parent's sender thread
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first request goes at once
        try:
            coalescer._send = lambda: os.write(write_end, b"sent")
            coalescer.ask()
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        assert pipe.read() == b"sent"
    assert os.WEXITSTATUS(status) == 0
