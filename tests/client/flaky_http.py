"""A real HTTP server on 127.0.0.1 that answers an error a number of times, then 200: for
the client's retries (test_portal_client.py) and the poll benchmark's refusals
(test_poll_bench.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def flaky_portal(
    failures: int, status: int = 503, answer: Any = ()
) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server that answers ``status`` ``failures`` times, then 200 with ``answer``."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            failing = len(seen) <= failures
            body = json.dumps(
                {"errors": {"detail": "database unavailable, try again"}}
                if failing
                else list(answer)
                if isinstance(answer, tuple)
                else answer
            ).encode()
            self.send_response(status if failing else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815 - http.server's names

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
