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

from portal.ops.supervisor import ChildExited, ChildSpec, CrashLoop, RestartPolicy, Supervisor


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


# --- restarts with backoff, and a crash loop ---------------------------------------------------


def tend_until(supervisor: Supervisor, done, *, policy, timeout_s: float = 15) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, supervisor.tail()
        supervisor.tend(policy=policy)
        time.sleep(0.02)


def test_tend_restarts_a_crashed_child_with_a_doubling_delay_and_says_so(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    out = io.StringIO()
    supervisor = Supervisor(output=out)
    policy = RestartPolicy(max_crashes=5, window_s=60, first_delay_s=0.2, max_delay_s=10)
    steady = supervisor.start(python_child("steady", "import time; time.sleep(60)"))
    supervisor.start(
        python_child(
            "flaky",
            f"""
            import sys
            with open({str(starts)!r}, 'a') as f:
                f.write('x')
            sys.exit(3)
            """,
        )
    )
    try:
        began = time.monotonic()
        tend_until(
            supervisor,
            lambda: len(starts.read_text() if starts.exists() else "") >= 3,
            policy=policy,
        )
        elapsed = time.monotonic() - began
    finally:
        supervisor.stop_all()

    text = out.getvalue()
    assert (
        "runportal: flaky exited with code 3; restarting it in 0.2 s (crash 1 of 5 allowed in 60 s)"
        in text
    )
    assert (
        "runportal: flaky exited with code 3; restarting it in 0.4 s (crash 2 of 5 allowed in 60 s)"
        in text
    )
    assert text.count("runportal: flaky restarted (pid ") >= 2
    assert elapsed >= 0.6  # 0.2 s, then 0.4 s
    # The steady child was left alone the whole time.
    assert supervisor.children[0] is steady


def test_tend_stops_a_crash_loop_naming_the_child(tmp_path: Path) -> None:
    out = io.StringIO()
    supervisor = Supervisor(output=out)
    policy = RestartPolicy(max_crashes=2, window_s=60, first_delay_s=0.05, max_delay_s=0.05)
    supervisor.start(python_child("worker", "import sys; print('no database'); sys.exit(1)"))
    try:
        with pytest.raises(CrashLoop) as loop:
            tend_until(supervisor, lambda: False, policy=policy)
    finally:
        supervisor.stop_all()
    assert str(loop.value) == (
        "worker crashed 3 times in 60 s (last exit code 1); not restarting it again"
    )
    assert "no database" in supervisor.tail()


def test_crashes_older_than_the_window_are_forgotten() -> None:
    supervisor = Supervisor(output=io.StringIO())
    policy = RestartPolicy(max_crashes=1, window_s=10, first_delay_s=0, max_delay_s=0)
    child = supervisor.start(python_child("beat", "import sys; sys.exit(2)"))
    child.process.wait()
    try:
        supervisor.tend(policy=policy, now=100.0)  # crash 1: restart due at once
        supervisor.tend(policy=policy, now=100.0)  # restarted
        supervisor.children[0].process.wait()
        supervisor.tend(policy=policy, now=111.0)  # crash 2, but crash 1 is 11 s old
        supervisor.tend(policy=policy, now=111.0)
        supervisor.children[0].process.wait()
        with pytest.raises(CrashLoop):
            supervisor.tend(policy=policy, now=112.0)  # two within 10 s
    finally:
        supervisor.stop_all()


# --- a child that needs longer to stop ---------------------------------------------------------


def test_stop_waits_a_childs_own_stop_timeout_before_killing_it(tmp_path: Path) -> None:
    """The agent stops its jobs on SIGTERM (each with its kill grace): it must not be killed
    after the supervisor's default timeout, or a job would be orphaned mid-stop."""
    finished = tmp_path / "finished"
    out = io.StringIO()
    supervisor = Supervisor(output=out, stop_timeout_s=0.3)
    slow = f"""
        import signal, sys, time
        def stop(*_):
            time.sleep(1.5)  # stopping its jobs
            open({str(finished)!r}, 'w').write('clean')
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print('ready')
        time.sleep(60)
        """
    agent = supervisor.start(python_child("agent", slow, stop_timeout_s=5.0))
    supervisor.wait_until(lambda: "ready" in out.getvalue(), timeout_s=10, what="agent")
    supervisor.stop_all()
    assert finished.read_text() == "clean"
    assert agent.exit_code() == 0
    assert "killing it" not in out.getvalue()


def test_the_agent_gets_its_kill_grace_plus_a_margin_to_stop(tmp_path: Path) -> None:
    from portal.ops.processes import AGENT_STOP_MARGIN_S, agent_spec

    def spec(**env: str) -> ChildSpec:
        return agent_spec(node="n1", workdir=tmp_path, broker_url="redis://x", env=env, key="k")

    assert spec(PORTAL_AGENT_KILL_GRACE_S="45").stop_timeout_s == 45 + AGENT_STOP_MARGIN_S
    assert spec().stop_timeout_s == 10 + AGENT_STOP_MARGIN_S
    assert spec().stop_timeout_s > 10.0  # runportal's default for the other children
