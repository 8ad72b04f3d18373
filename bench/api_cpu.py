"""CPU per API request, in one process: what `make bench-api`'s req/s are made of.

The end-to-end figures of ``bench/api.py`` depend on how busy the machine is; this one does
not, much. On a scratch database next to DATABASE_URL (dropped afterwards) it builds the
world of ``bench/api.py`` (``--nodes`` nodes of 8 GPUs, ``--users`` members with a token each,
``--history`` ended jobs), then calls the WSGI application itself, as gunicorn does (every
middleware, authentication, throttling, the view, rendering), ``--repeats`` times per
request kind, the tokens taken in turn, and prints for each kind the CPU time of this process
per request (``time.process_time``: the database server's and Redis' time are not in it), the
database server's CPU per request (the PostgreSQL backend serving this process, read from
``/proc`` when the server runs on this machine), the wall time and the statements per request. ``--profile`` prints cProfile's top functions by
cumulative and by own time, in CPU
time.

``python -m bench.api_cpu [--repeats 300] [--profile] [--sql] [--only list_limit_1,submit]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

ROOT = Path(__file__).resolve().parent.parent
SCRATCH_SUFFIX = "_api_cpu_bench"

# name -> (method, path, body, expected status)
REQUESTS: dict[str, tuple[str, str, dict[str, Any] | None, int]] = {
    "list_limit_1": ("GET", "/api/v1/jobs/?limit=1", None, 200),
    "list": ("GET", "/api/v1/jobs/", None, 200),
    "submit": ("POST", "/api/v1/jobs/", None, 201),  # the body: bench.api.SUBMIT_BODY
}


def wsgi_caller(application: Callable[..., Any]) -> Callable[..., tuple[int, bytes]]:
    """A function that sends one request through ``application`` as a WSGI server would."""

    def call(method: str, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        path_info, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path_info,
            "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "REMOTE_ADDR": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8000",
            "HTTP_AUTHORIZATION": f"Token {token}",
            "HTTP_ACCEPT": "application/json",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.url_scheme": "http",
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        status: list[str] = []

        def start_response(line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            status.append(line)

        result = application(environ, start_response)
        try:
            content = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return int(status[0].split()[0]), content

    return call


def measure(
    name: str,
    *,
    call: Callable[..., tuple[int, bytes]],
    tokens: list[str],
    repeats: int,
    profile: bool,
    show_sql: bool = False,
) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.api import SUBMIT_BODY

    method, path, body, expected = REQUESTS[name]
    payload = json.dumps(SUBMIT_BODY if name == "submit" else body or {}).encode()
    payload = payload if method == "POST" else b""
    # Warm up: imports, the first connection, caches filled on first use, and each token's
    # last-used time (written at most once a minute per token: under load, a write per token
    # a minute, not part of a request's usual cost).
    for index in range(len(tokens)):
        status, content = call(method, path, payload, tokens[index % len(tokens)])
        if status != expected:
            raise SystemExit(f"{name}: {status} instead of {expected}: {content[:300]!r}")
    with CaptureQueriesContext(connection) as queries:
        call(method, path, payload, tokens[5 % len(tokens)])
    statements = len(queries.captured_queries)
    if show_sql:
        for query in queries.captured_queries:
            print(f"  SQL {query['sql'][:400]}")
    # Timed by this process's CPU clock: waiting on the database is not what we look for.
    profiler = cProfile.Profile(time.process_time) if profile else None
    backend = database_backend_pid()
    db_began = backend_cpu_s(backend)
    cpu_began, wall_began = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    for index in range(repeats):
        status, content = call(method, path, payload, tokens[index % len(tokens)])
        if status != expected:
            raise SystemExit(f"{name}: {status} instead of {expected}: {content[:300]!r}")
    if profiler is not None:
        profiler.disable()
    cpu_ms = (time.process_time() - cpu_began) * 1000 / repeats
    wall_ms = (time.perf_counter() - wall_began) * 1000 / repeats
    db_ended = backend_cpu_s(backend)
    db_cpu_ms = (
        None
        if db_began is None or db_ended is None or database_backend_pid() != backend
        else (db_ended - db_began) * 1000 / repeats
    )
    figures = {
        "cpu_ms": round(cpu_ms, 2),
        "db_cpu_ms": None if db_cpu_ms is None else round(db_cpu_ms, 2),
        "wall_ms": round(wall_ms, 2),
        "statements": statements,
        "repeats": repeats,
        "profiled": profile,
    }
    db_shown = "  n/a" if db_cpu_ms is None else f"{db_cpu_ms:5.2f}"
    print(
        f"{name:14s} {method:4s} {path:24s} {cpu_ms:6.2f} ms CPU, {db_shown} ms database CPU, "
        f"{wall_ms:6.2f} ms wall, "
        f"{statements} statements ({repeats} requests{', under cProfile' if profile else ''})",
        flush=True,
    )
    if profiler is not None:
        print_profile(profiler)
    return figures


def database_backend_pid() -> int | None:
    """The process id of the PostgreSQL backend serving this process's connection."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def backend_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``), or None when
    it cannot be read (the database server on another machine)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command's closing parenthesis: utime and stime are the 12th and 13th fields.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def print_profile(profiler: cProfile.Profile) -> None:
    """cProfile's 30 top functions, by cumulative and by own time."""
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
        print(text.getvalue())


def run(
    *,
    repeats: int = 300,
    nodes: int = 250,
    users: int = 200,
    history: int = 20_000,
    only: list[str] | None = None,
    profile: bool = False,
    show_sql: bool = False,
) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from django.db import connection

    from bench.api import _build_world
    from bench.db_pass import scratch_database
    from portal.agents.testing import capture_sent_messages

    results: dict[str, Any] = {"nodes": nodes, "users": users, "history": history}
    with scratch_database(SCRATCH_SUFFIX) as vendor:
        results["database"] = vendor
        call_command("migrate", verbosity=0, interactive=False)
        with capture_sent_messages():
            world = _build_world(nodes=nodes, users=users, history=history)
        connection.close()
        call = wsgi_caller(get_wsgi_application())
        for name in only or list(REQUESTS):
            results[name] = measure(
                name,
                call=call,
                tokens=world["tokens"],
                repeats=repeats,
                profile=profile,
                show_sql=show_sql,
            )
        connection.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api_cpu", description=__doc__)
    parser.add_argument("--repeats", type=int, default=300, help="requests of each kind")
    parser.add_argument("--nodes", type=int, default=250, help="nodes of 8 GPUs")
    parser.add_argument("--users", type=int, default=200, help="members, one token each")
    parser.add_argument("--history", type=int, default=20_000, help="ended jobs in the table")
    parser.add_argument(
        "--only", default="", help=f"comma-separated, of {', '.join(REQUESTS)} (default: all)"
    )
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--sql", action="store_true", help="print one request's statements")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in REQUESTS]
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)}; allowed: {', '.join(REQUESTS)}")
    run(
        repeats=args.repeats,
        nodes=args.nodes,
        users=args.users,
        history=args.history,
        only=only or None,
        profile=args.profile,
        show_sql=args.sql,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
