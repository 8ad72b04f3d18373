"""The supervisor behind `runportal` and `PortalStack`: output, deaths, and a clean stop."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from portal.ops.supervisor import ChildExited, ChildSpec, Supervisor


def python_child(name: str, code: str, **kwargs: object) -> ChildSpec:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return ChildSpec(
        name=name, argv=[sys.executable, "-c", textwrap.dedent(code)], env=env, **kwargs
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has stopped running all the same.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[1].split()[0] == "Z")


def test_it_prefixes_every_line_with_the_child_name() -> None:
    out = io.StringIO()
    supervisor = Supervisor(output=out)
    supervisor.start(python_child("web", "print('hello'); print('second line')"))
    supervisor.start(python_child("beat", "print('tick')"))
    deadline = time.monotonic() + 10
    while "second line" not in out.getvalue() or "tick" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    supervisor.stop_all()
    lines = out.getvalue().splitlines()
    assert "web    | hello" in lines
    assert "web    | second line" in lines
    assert "beat   | tick" in lines


def test_it_reports_the_child_that_exited_on_its_own() -> None:
    supervisor = Supervisor(output=io.StringIO())
    supervisor.start(python_child("steady", "import time; time.sleep(60)"))
    supervisor.start(python_child("flaky", "import sys; print('boom'); sys.exit(3)"))
    with pytest.raises(ChildExited) as died:
        supervisor.wait_until(lambda: False, timeout_s=10, what="never")
    supervisor.stop_all()
    assert died.value.child.name == "flaky"
    assert died.value.code == 3
    assert "flaky exited unexpectedly with code 3" in str(died.value)
    assert "boom" in supervisor.tail()


def test_stop_all_terminates_children_and_kills_one_that_ignores_sigterm() -> None:
    out = io.StringIO()
    supervisor = Supervisor(output=out, stop_timeout_s=1.0)
    polite = supervisor.start(python_child("polite", "import time; time.sleep(60)"))
    stubborn = supervisor.start(
        python_child(
            "stubborn",
            """
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print('ready')
            time.sleep(60)
            """,
        )
    )
    supervisor.wait_until(lambda: "ready" in out.getvalue(), timeout_s=10, what="stubborn")
    started = time.monotonic()
    supervisor.stop_all()
    assert time.monotonic() - started < 5
    assert polite.exit_code() == -signal.SIGTERM
    assert stubborn.exit_code() == -signal.SIGKILL
    assert "stubborn did not stop in 1 s: killing it" in out.getvalue()


def test_the_broker_stops_only_after_the_others_have_exited(tmp_path: Path) -> None:
    """A worker shutting down may still talk to the broker; the broker must still be there."""
    record = tmp_path / "order"
    on_term = f"""
        import signal, sys, time
        def stop(*_):
            time.sleep({{delay}})
            with open({str(record)!r}, 'a') as f:
                f.write('{{name}}\\n')
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print('ready')
        time.sleep(60)
        """
    out = io.StringIO()
    supervisor = Supervisor(output=out)
    supervisor.start(python_child("broker", on_term.format(delay=0, name="broker"), stop_last=True))
    supervisor.start(python_child("worker", on_term.format(delay=0.5, name="worker")))
    supervisor.wait_until(
        lambda: out.getvalue().count("ready") == 2, timeout_s=10, what="both children"
    )
    supervisor.stop_all()
    assert record.read_text().split() == ["worker", "broker"]


def test_children_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    script = tmp_path / "supervise.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys, time
            sys.path.insert(0, {str(Path.cwd())!r})
            from portal.ops.supervisor import ChildSpec, Supervisor
            supervisor = Supervisor(output=open(os.devnull, 'w'))
            child = supervisor.start(ChildSpec(name='sleeper', argv=['sleep', '60'], env=dict(os.environ)))
            print(child.process.pid, flush=True)
            time.sleep(60)
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert alive(child_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child_pid):
        assert time.monotonic() < deadline, "the child outlived its killed supervisor"
        time.sleep(0.05)
