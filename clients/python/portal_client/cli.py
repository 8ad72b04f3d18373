"""`gpu-portal`: the portal from a terminal.

    gpu-portal login --url http://127.0.0.1:8000/          # asks for the token, saves it (0600)
    gpu-portal submit --team vision --image python:3.11-slim --gpu mig --profile 1g.10gb \\
        --name hello -- python3 -c 'print("hi")'
    gpu-portal logs -f                                      # the job submitted last
    gpu-portal ls --state pending,running --watch

Tables for people, ``--json`` for scripts. Exit codes: 0 done (the job succeeded), 1 the job
failed (FAILED, CANCELLED, TIMED_OUT), 2 a usage error (bad flags, no token configured),
3 the portal refused or could not be reached, 4 ``wait`` timed out (the job goes on),
130 interrupted.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from portal_client.client import PortalClient, __version__
from portal_client.config import (
    ConfigError,
    config_path,
    last_job,
    load_settings,
    read_config,
    remember_last_job,
    write_config,
)
from portal_client.errors import PortalError, WaitTimeout
from portal_client.jobs import STATES, TERMINAL, Job, format_duration, format_eta, status_line

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_PORTAL = 3
EXIT_WAIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A command line that cannot work (exit 2)."""


# --- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 itself on bad flags
    try:
        return int(args.handler(args))
    except (UsageError, ConfigError) as error:
        _complain(args, "usage", str(error))
        return EXIT_USAGE
    except WaitTimeout as error:
        _complain(args, "timeout", str(error))
        return EXIT_WAIT_TIMEOUT
    except PortalError as error:
        _complain(args, type(error).__name__, str(error), status=error.status, errors=error.errors)
        return EXIT_PORTAL
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED


def _complain(args: argparse.Namespace, kind: str, message: str, **fields: Any) -> None:
    if getattr(args, "json", False):
        print(json.dumps({"error": kind, "message": message, **fields}), file=sys.stderr)
    else:
        print(f"gpu-portal: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-portal",
        description="Submit, follow and manage GPU jobs on the portal.",
        epilog="Exit codes: 0 done/succeeded, 1 the job failed, 2 usage error, 3 portal error, "
        "4 wait timed out. The portal and token come from --url/--token, else PORTAL_URL and "
        f"PORTAL_TOKEN, else {config_path()} (written by `gpu-portal login`).",
    )
    parser.add_argument("--version", action="version", version=f"gpu-portal {__version__}")
    _add_common(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)

    def command(name: str, handler: Callable[[argparse.Namespace], int], text: str) -> Any:
        sub = commands.add_parser(name, parents=[common], help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    login = command("login", cmd_login, "check a token and save it with the portal's URL")
    login.add_argument("--print-path", action="store_true", help="only print the config path")

    submit = command("submit", cmd_submit, "submit a job (flags, or -f job.yaml/.json)")
    _add_submit_flags(submit)

    ls = command("ls", cmd_ls, "list my teams' jobs, newest first")
    ls.add_argument("--state", help="only these states, comma-separated (pending,running)")
    ls.add_argument("--team", help="only this team's jobs")
    ls.add_argument("--limit", type=_positive_int, default=50, help="at most this many (50)")
    ls.add_argument("--all", action="store_true", help="every job, page after page")
    ls.add_argument(
        "--watch",
        nargs="?",
        type=_positive_float,
        const=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (2) until Ctrl-C",
    )

    show = command("show", cmd_show, "one job: state, reason, slices, events")
    _add_job_id(show)

    logs = command("logs", cmd_logs, "a job's output; -f follows it until the job ends")
    _add_job_id(logs)
    logs.add_argument("-f", "--follow", action="store_true", help="print it as it comes")
    logs.add_argument("--attempt", type=_positive_int, help="an earlier attempt")
    logs.add_argument("--poll", type=_positive_float, default=1.0, help=argparse.SUPPRESS)

    wait = command("wait", cmd_wait, "wait until a job ended (or reached --state)")
    _add_job_id(wait)
    wait.add_argument("--state", help="wait for these states instead, comma-separated")
    wait.add_argument("--timeout", type=_duration, help="give up after this (e.g. 600, 2h)")
    wait.add_argument("--poll", type=_positive_float, default=1.0, help="seconds between polls")
    wait.add_argument("-q", "--quiet", action="store_true", help="no progress line")

    for name, handler, text in (
        ("cancel", cmd_cancel, "cancel jobs: waiting ones at once, running ones by their agent"),
        ("hold", cmd_hold, "hold pending jobs: the scheduler skips them until released"),
        ("release", cmd_release, "release held jobs: back in the queue, at its end"),
    ):
        action = command(name, handler, text)
        action.add_argument("job_ids", nargs="+", type=_positive_int, metavar="JOB_ID")

    resubmit = command("resubmit", cmd_resubmit, "a new job with an ended job's request")
    resubmit.add_argument("job_id", type=_positive_int, metavar="JOB_ID")

    command("teams", cmd_teams, "my teams: quota, what they hold now, their jobs")
    usage = command(
        "usage",
        cmd_usage,
        "GPU-unit-hours used (over --from..--to, and this month against the budget) and "
        "what each team holds now against its quota; one team: per member too",
    )
    usage.add_argument("team", nargs="?", help="one team (default: all of mine)")
    usage.add_argument("--from", dest="start", type=_day, help="first day, YYYY-MM-DD (UTC)")
    usage.add_argument("--to", dest="end", type=_day, help="last day (default: today)")
    return parser


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # On the main parser and on every command, so `gpu-portal --json ls` and `gpu-portal ls
    # --json` both work; SUPPRESS keeps a command from resetting what the main parser read.
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--url", default=default, help="the portal, e.g. http://127.0.0.1:8000/")
    parser.add_argument("--token", default=default, help="an API token (better: PORTAL_TOKEN)")
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="JSON on stdout, for scripts",
    )


def _add_job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "job_id",
        nargs="?",
        type=_positive_int,
        metavar="JOB_ID",
        help="default: the job `gpu-portal submit` made last on this machine",
    )


def _add_submit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", help="the request as YAML or JSON ('-': stdin); flags win")
    parser.add_argument("--name", help="1 to 128 characters")
    parser.add_argument("--team", help="a team you are a member of")
    parser.add_argument("--image", help="e.g. python:3.11-slim")
    parser.add_argument("--gpu", dest="kind", help="whole, mig or mps")
    parser.add_argument("--count", type=_positive_int, help="slices (more than one: a gang)")
    parser.add_argument("--min-count", type=_positive_int, help="an elastic gang's minimum")
    parser.add_argument("--profile", help="MIG profile, e.g. 1g.10gb")
    parser.add_argument("--model", help="GPU model (whole GPUs), e.g. 'NVIDIA A100'")
    parser.add_argument("--multi-node", action="store_true", default=None, help="gang may span")
    parser.add_argument("--priority", help="low, normal or high (up to the team's maximum)")
    parser.add_argument("--time-limit", type=_duration, help="e.g. 3600, 90m, 2h, 1h30m")
    parser.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the scheduler may preempt it (default: yes)",
    )
    parser.add_argument(
        "-e", "--env", action="append", type=_env_pair, default=[], metavar="KEY=VALUE"
    )
    parser.add_argument("--after-ok", action="append", type=_positive_int, default=[])
    parser.add_argument("--after-any", action="append", type=_positive_int, default=[])
    parser.add_argument(
        "--notify",
        metavar="EVENTS",
        help="tell me about this job's events: start, end, fail, preempt, comma separated "
        "('' for none; default: my notification settings)",
    )
    parser.add_argument(
        "--array-count",
        type=_positive_int,
        metavar="N",
        help="a job array of N jobs, each with PORTAL_ARRAY_INDEX 0..N-1",
    )
    parser.add_argument(
        "--array-values",
        action="append",
        type=_array_values,
        default=[],
        metavar="NAME=V1,V2,...",
        help="a sweep: one job per combination of the values (repeat for more names), each "
        "with its values as env variables",
    )
    parser.add_argument(
        "--max-running",
        type=_positive_int,
        metavar="N",
        help="a job array runs at most N of its jobs at once (Slurm's %%N)",
    )
    parser.add_argument("--wait", action="store_true", help="then wait; exit 0/1 by the result")
    parser.add_argument("--follow", action="store_true", help="then print its log as it comes")
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="print the job id (an array's id) only"
    )
    parser.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command (argv)"
    )


# --- commands --------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    if args.print_path:
        print(config_path())
        return EXIT_OK
    url = (
        args.url
        or os.environ.get("PORTAL_URL", "").strip()
        or read_config().get("url")
        or _ask("Portal URL (e.g. http://127.0.0.1:8000/): ")
    )
    token = (
        args.token
        or os.environ.get("PORTAL_TOKEN", "").strip()
        or _ask_secret(
            "API token (from the portal's Tokens page or `manage.py issue_token <user>`): "
        )
    )
    if not url or not token:
        raise UsageError("login needs the portal's URL and a token")
    with PortalClient(url, token) as portal:
        teams = portal.teams()  # a refused token is not saved
    path = write_config(url=portal.url, token=token)
    names = ", ".join(team["name"] for team in teams) or "none"
    if args.json:
        _print_json({"url": portal.url, "config": str(path), "teams": names.split(", ")})
    else:
        print(f"logged in to {portal.url}; token saved in {path} (mode 0600); teams: {names}")
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    request = submit_request(args)
    if "array" in request:
        return _submit_array(args, request)
    with _client(args) as portal:
        job = portal.submit(**request)
        remember_last_job(job.id)
        if args.quiet:
            print(job.id)
        elif args.json and not (args.wait or args.follow):
            _print_json(job.data)
        else:
            print(f"submitted job {job.id} {job.name!r} to team {job.team}: {status_line(job)}")
            if not (args.wait or args.follow):
                print(f"follow it: gpu-portal logs -f {job.id}")
        sys.stdout.flush()
        if args.follow:
            _follow(portal, job.id, attempt=None, poll=1.0, as_json=args.json)
        if args.wait or args.follow:
            return _finish(portal.wait(job.id, progress=_progress_wanted(args)), args)
    return EXIT_OK


def _submit_array(args: argparse.Namespace, request: dict[str, Any]) -> int:
    if args.wait or args.follow:
        raise UsageError("--wait and --follow are for one job, not a job array")
    array = request.pop("array")
    with _client(args) as portal:
        made = portal.submit_array(array, **request)
    if args.quiet:
        print(made["id"])
    elif args.json:
        _print_json(made)
    else:
        ids = made["job_ids"]
        throttle = f", at most {made['max_running']} at once" if made["max_running"] else ""
        print(
            f"submitted array {made['id']} {made['name']!r} to team {made['team']}: "
            f"{len(ids)} jobs {ids[0]}..{ids[-1]}{throttle}"
        )
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    states = _states(args.state)
    limit = None if args.all else args.limit
    with _client(args) as portal:
        try:
            return _list_jobs(portal, args, states=states, limit=limit)
        except KeyboardInterrupt:
            if args.watch is None:
                raise
            return EXIT_OK  # Ctrl-C is how watching ends


def _list_jobs(
    portal: PortalClient, args: argparse.Namespace, *, states: list[str] | None, limit: int | None
) -> int:
    while True:
        jobs = portal.jobs(state=states, team=args.team, limit=limit)
        if args.json:
            _print_json([job.data for job in jobs])
        else:
            if args.watch is not None and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")  # clear the screen, like watch(1)
            if args.watch is not None:
                print(f"{datetime.now(UTC):%H:%M:%S} UTC, every {args.watch:g} s; Ctrl-C ends")
            _print_table(
                ["ID", "NAME", "TEAM", "USER", "STATE", "GPU", "WHY / WHERE", "ELAPSED"],
                [_job_row(job) for job in jobs],
            )
        sys.stdout.flush()
        if args.watch is None:
            return EXIT_OK
        time.sleep(args.watch)


def cmd_show(args: argparse.Namespace) -> int:
    with _client(args) as portal:
        job = portal.job(_job_id(args))
    if args.json:
        _print_json(job.data)
        return EXIT_OK
    data = job.data
    gpu = data.get("gpu") or {}
    facts: list[tuple[str, Any]] = [
        ("job", f"{job.id} {job.name!r}"),
        ("team / user", f"{job.team} / {job.user}"),
        ("state", job.state + (f" (attempt {job.attempt})" if job.attempt > 1 else "")),
        ("reason", job.reason),
        ("queue position", job.position),
        ("estimated start", format_eta(job.eta) if job.pending is not None else None),
        ("gpu", _gpu_text(gpu)),
        ("priority", data.get("priority")),
        ("slices", job.slice),
        ("exit code", job.exit_code),
        ("submitted", _time_text(job.submitted_at)),
        ("started", _time_text(job.started_at)),
        ("finished", _time_text(job.finished_at)),
        ("run time", format_duration(job.run_time) if job.run_time is not None else None),
        ("image", data.get("image")),
        ("command", " ".join(data.get("command") or [])),
    ]
    width = max(len(label) for label, _ in facts)
    for label, value in facts:
        if value not in (None, ""):
            print(f"{label:<{width}}  {value}")
    events = data.get("events") or []
    if events:
        print("events:")
        for event in events:
            moved = f"{event['from_state']} -> " if event.get("from_state") else ""
            at = _time_text(datetime.fromisoformat(event["at"].replace("Z", "+00:00")))
            message = f"  {event['message']}" if event.get("message") else ""
            print(f"  {at}  {moved}{event['to_state']}{message}")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    job_id = _job_id(args)
    with _client(args) as portal:
        if not args.follow:
            text = portal.log(job_id, attempt=args.attempt)
            if args.json:
                _print_json({"job": job_id, "attempt": args.attempt, "log": text})
            else:
                sys.stdout.write(text)
            return EXIT_OK
        _follow(portal, job_id, attempt=args.attempt, poll=args.poll, as_json=args.json)
        return _finish(portal.job(job_id), args, quiet=True)


def cmd_wait(args: argparse.Namespace) -> int:
    wanted = _states(args.state) or sorted(TERMINAL)
    with _client(args) as portal:
        job = portal.wait(
            _job_id(args),
            states=wanted,
            timeout=args.timeout,
            poll=args.poll,
            progress=_progress_wanted(args),
        )
    if args.state:
        if args.json:
            _print_json(job.data)
        else:
            print(status_line(job))
        return EXIT_OK
    return _finish(job, args)


def cmd_cancel(args: argparse.Namespace) -> int:
    return _act_on_each(args, lambda portal, job_id: portal.cancel(job_id))


def cmd_hold(args: argparse.Namespace) -> int:
    return _act_on_each(args, lambda portal, job_id: portal.hold(job_id))


def cmd_release(args: argparse.Namespace) -> int:
    return _act_on_each(args, lambda portal, job_id: portal.release(job_id))


def cmd_resubmit(args: argparse.Namespace) -> int:
    with _client(args) as portal:
        job = portal.resubmit(args.job_id)
    remember_last_job(job.id)
    if args.json:
        _print_json(job.data)
    else:
        print(f"resubmitted job {args.job_id} as job {job.id}: {status_line(job)}")
    return EXIT_OK


def cmd_teams(args: argparse.Namespace) -> int:
    with _client(args) as portal:
        teams = portal.teams()
    if args.json:
        _print_json(teams)
        return EXIT_OK
    _print_table(
        ["TEAM", "WEIGHT", "GUARANTEE", "LIMIT", "IN USE", "RUNNING", "PENDING", "HELD"],
        [
            [
                team["name"],
                _number(team["weight"]),
                _number(team["guaranteed_units"]),
                _number(team["limit_units"]),
                _number(team["units_in_use"]),
                team["running_jobs"],
                team["pending_jobs"],
                team["held_jobs"],
            ]
            for team in teams
        ],
    )
    return EXIT_OK


def cmd_usage(args: argparse.Namespace) -> int:
    with _client(args) as portal:
        names = [args.team] if args.team else [team["name"] for team in portal.teams()]
        reports = [portal.usage(name, args.start, args.end) for name in names]
    if args.json:
        _print_json(reports)
        return EXIT_OK
    if reports:
        days = reports[0]["days"]
        print(f"GPU-unit-hours from {days[0]['date']} to {days[-1]['date']}; this month "
              "against the budget; GPU units held now against the quota.")  # fmt: skip
    _print_table(
        ["TEAM", "UNIT-H", "THIS MONTH", "BUDGET", "LEFT", "HELD", "GUARANTEE", "LIMIT",
         "BORROWED"],
        [
            [
                report["team"],
                _number(round(sum(day["gpu_unit_hours"] for day in report["days"]), 2)),
                _number(round(report["period"]["gpu_unit_hours"], 2)),
                _number(report["period"]["budget_gpu_unit_hours"]),
                _number(_rounded(report["period"]["budget_left_gpu_unit_hours"])),
                _number(report["quota"]["held_units"]),
                _number(report["quota"]["guaranteed_units"]),
                _number(report["quota"]["limit_units"]),
                _number(report["quota"]["borrowed_units"]),
            ]
            for report in reports
        ],
    )  # fmt: skip
    if args.team:
        (report,) = reports
        print()
        _print_table(
            ["MEMBER", "ROLE", "UNIT-H", "THIS MONTH"],
            [
                [
                    member["username"],
                    member["role"] or "(left)",
                    _number(round(member["gpu_unit_hours"], 2)),
                    _number(round(member["period_gpu_unit_hours"], 2)),
                ]
                for member in report["members"]
            ],
        )
        if not report["every_member"]:
            print("(only you: the team's admins see every member)")
    return EXIT_OK


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- helpers ---------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> PortalClient:
    settings = load_settings(url=args.url, token=args.token)
    return PortalClient(settings.url, settings.token)


def _job_id(args: argparse.Namespace) -> int:
    if args.job_id is not None:
        return int(args.job_id)
    remembered = last_job()
    if remembered is None:
        raise UsageError("give a JOB_ID (no job was submitted from this machine yet)")
    return remembered


def _follow(
    portal: PortalClient, job_id: int, *, attempt: int | None, poll: float, as_json: bool
) -> None:
    for piece in portal.follow_log(job_id, attempt=attempt, poll=poll):
        if as_json:
            print(json.dumps({"job": job_id, "log": piece}))
        else:
            sys.stdout.write(piece)
        sys.stdout.flush()


def _finish(job: Job, args: argparse.Namespace, *, quiet: bool = False) -> int:
    """Say how the job ended; 0 when it succeeded, 1 when it ended otherwise."""
    if args.json and not quiet:
        _print_json(job.data)
    elif not quiet or not job.succeeded:
        reason = f" ({job.reason})" if job.reason and not job.succeeded else ""
        print(status_line(job) + reason, file=sys.stderr if quiet else sys.stdout)
    if job.succeeded:
        return EXIT_OK
    return EXIT_JOB_FAILED if job.done else EXIT_OK


def _act_on_each(args: argparse.Namespace, act: Callable[[PortalClient, int], Job]) -> int:
    refused = 0
    done: list[dict[str, Any]] = []
    with _client(args) as portal:
        for job_id in args.job_ids:
            try:
                job = act(portal, job_id)
            except PortalError as error:
                if len(args.job_ids) == 1:
                    raise
                refused += 1
                _complain(args, type(error).__name__, f"job {job_id}: {error}")
                continue
            done.append(job.data)
            if not args.json:
                print(status_line(job))
    if args.json:
        _print_json(done)
    return EXIT_PORTAL if refused else EXIT_OK


def _progress_wanted(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() and not getattr(args, "quiet", False) and not args.json


def submit_request(args: argparse.Namespace) -> dict[str, Any]:
    """The body ``gpu-portal submit``'s flags (and ``-f`` file) make, not yet checked."""
    request = _read_request_file(args.file) if args.file else {}
    for field in ("name", "team", "image", "priority"):
        if getattr(args, field) is not None:
            request[field] = getattr(args, field)
    if args.time_limit is not None:
        request["time_limit_s"] = int(args.time_limit)
    if args.preemptible is not None:
        request["preemptible"] = args.preemptible
    gpu = dict(request.get("gpu") or {})
    for flag, field in (
        ("kind", "kind"),
        ("count", "count"),
        ("min_count", "min_count"),
        ("profile", "profile"),
        ("model", "model"),
        ("multi_node", "multi_node"),
    ):
        if getattr(args, flag) is not None:
            gpu[field] = getattr(args, flag)
    if gpu:
        request["gpu"] = gpu
    if args.env:
        request["env"] = {**(request.get("env") or {}), **dict(args.env)}
    dependencies = [{"job": job, "kind": "after_ok"} for job in args.after_ok]
    dependencies += [{"job": job, "kind": "after_any"} for job in args.after_any]
    if dependencies:
        request["depends_on"] = [*(request.get("depends_on") or []), *dependencies]
    if args.notify is not None:
        request["notify"] = [event.strip() for event in args.notify.split(",") if event.strip()]
    array = dict(request.get("array") or {})
    if args.array_count is not None:
        array["count"] = args.array_count
    if args.array_values:
        array["values"] = {**(array.get("values") or {}), **dict(args.array_values)}
    if args.max_running is not None:
        if not array:
            raise UsageError(
                "--max-running is for a job array: add --array-count or --array-values"
            )
        array["max_running"] = args.max_running
    if array:
        request["array"] = array
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if command:
        request["command"] = command
    if "name" not in request and command:
        request["name"] = Path(command[0]).name[:128]  # like sbatch: the program's name
    # The portal checks the rest (a missing command included) and names each bad field.
    return request


def _read_request_file(name: str) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]

    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"-f {name}: {error.strerror or error}") from None
    try:
        data = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise UsageError(
            f"-f {name}: not valid {'JSON' if name.endswith('.json') else 'YAML'}: {error}"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"-f {name}: must hold one mapping of the job's fields (name, team, ...)")
    return data


def _states(text: str | None) -> list[str] | None:
    if not text:
        return None
    states = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [state for state in states if state not in STATES]
    if unknown:
        raise UsageError(
            f"--state: unknown {', '.join(unknown)}; allowed: {', '.join(sorted(STATES))}"
        )
    return states


def _job_row(job: Job) -> list[Any]:
    if job.state == "PENDING":
        where = job.reason_code or "waiting for a pass"
        if job.position is not None:
            where += f" #{job.position}"
    elif job.done:
        where = f"exit {job.exit_code}" if job.exit_code is not None else job.reason or ""
    else:
        where = job.slice or ""
    if job.run_time is not None:
        elapsed = format_duration(job.run_time)
    elif job.submitted_at is not None and not job.done:
        elapsed = "waiting " + format_duration(datetime.now(UTC) - job.submitted_at)
    else:
        elapsed = ""
    return [
        job.id,
        _cut(job.name, 24),
        job.team,
        job.user,
        job.state,
        _gpu_text(job.data.get("gpu") or {}),
        _cut(where, 36),
        elapsed,
    ]


def _gpu_text(gpu: dict[str, Any]) -> str:
    if not gpu:
        return ""
    detail = gpu.get("profile") or gpu.get("model") or ""
    count = gpu.get("count", 1)
    minimum = f"{gpu['min_count']}.." if gpu.get("min_count") else ""
    return f"{gpu.get('kind', '?')}{' ' + detail if detail else ''} x{minimum}{count}"


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[["" if cell is None else str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    for row in cells:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    if not rows:
        print("(none)")


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value):g}"


def _time_text(when: datetime | None) -> str | None:
    return f"{when:%Y-%m-%d %H:%M:%S} UTC" if when is not None else None


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().strip()
    return input(prompt).strip()


def _ask_secret(prompt: str) -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().strip()
    return getpass.getpass(prompt).strip()


# --- argument types (argparse turns their ValueError into exit 2 with the message) -----------


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    """Seconds: ``3600``, ``90m``, ``2h``, ``1h30m``, ``1d``."""
    compact = text.strip().lower()
    if compact.isdigit() and int(compact) > 0:
        return int(compact)
    parts = _DURATION.findall(compact)
    if parts and "".join(number + unit for number, unit in parts) == compact:
        seconds = sum(int(number) * _UNIT_S[unit] for number, unit in parts)
        if seconds > 0:
            return seconds
    raise argparse.ArgumentTypeError(f"{text!r} is not a duration; allowed: 3600, 90m, 2h, 1h30m")


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date; allowed: YYYY-MM-DD") from None


def _array_values(text: str) -> tuple[str, list[str]]:
    name, sep, values = text.partition("=")
    items = [item.strip() for item in values.split(",") if item.strip()]
    if not sep or not name.strip() or not items:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=V1,V2,...")
    return name.strip(), items


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value
