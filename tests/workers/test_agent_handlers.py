"""The agent's handlers: idempotency by (job_id, attempt), fencing tokens, the outbox and its
acknowledgements, the lease and self-fencing, signed messages, heartbeats and metrics.

No broker: the agent sends through a RecordingSender and launches ScriptedRuns; messages
from the portal arrive as signed envelopes, as they do through Celery.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from agent_doubles import (
    GPU_0,
    NODE,
    TEST_KEY,
    RecordingSender,
    ScriptedLauncher,
    make_launch,
    sealed,
)
from fake_nvml import FakeNvml, busy_gpu

from workers.agent import Agent
from workers.inventory import discover
from workers.launch import LaunchError
from workers.launchers.process import EndedRun
from workers.lease import read_lease
from workers.logship import LogMark
from workers.metrics import NvmlSampler
from workers.protocol import (
    Ack,
    AttemptSample,
    DeviceSample,
    Finished,
    Heartbeat,
    Inventory,
    Launches,
    LogChunk,
    Message,
    Metrics,
    Query,
    ReportKey,
    Reports,
    RunningAttempt,
    Started,
    Stop,
)
from workers.shim import OUTPUT_FILE

CLOCK = 1_700_000_000.0
LEASE_S = 1000.0


class Clock:
    def __init__(self, now: float = CLOCK) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_agent(
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    workdir: Path,
    *,
    sampler: NvmlSampler | None = None,
    clock: Clock | None = None,
    leased: bool = True,
    inventory: Inventory | None = None,
) -> Agent:
    agent = Agent(
        node=NODE,
        inventory=inventory or discover(NODE, source="described"),
        launcher=launcher,
        send=sender,
        workdir=workdir,
        key=TEST_KEY,
        kill_grace_s=3.0,
        sampler=sampler,
        clock=clock or Clock(),
        boot="boot-1",
        address="10.9.8.7",
    )
    if leased:
        grant_lease(agent)
    return agent


def grant_lease(agent: Agent) -> None:
    """What the portal does with an accepted heartbeat: acknowledge it."""
    heartbeat = agent.heartbeat()
    deliver(agent, Ack(node=NODE, boot=agent.boot, heartbeat_seq=heartbeat.seq, lease_s=LEASE_S))


def deliver(agent: Agent, message: Message) -> None:
    agent.handle(sealed(message, now=agent._clock()))


def launch(agent: Agent, **kwargs: object) -> None:
    deliver(agent, make_launch(["python", "train.py"], **kwargs))  # type: ignore[arg-type]


def stop(agent: Agent, reason: str = "cancel", attempt: int = 0) -> None:
    deliver(agent, Stop(node=NODE, job_id=1, attempt=attempt, reason=reason, grace_s=4.0))  # type: ignore[arg-type]


@pytest.fixture
def launcher() -> ScriptedLauncher:
    return ScriptedLauncher(output=[b"hello\n"])


@pytest.fixture
def agent(sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path) -> Agent:
    agent = make_agent(sender, launcher, tmp_path)
    yield agent
    for run in launcher.runs:
        if run.code is None:
            run.exit(0)
    assert agent.supervisor.join(5)


# --- launching and stopping -------------------------------------------------------------------


def test_a_launch_starts_the_attempt_and_reports_started_then_finished(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    started = sender.started()
    assert started == Started(node=NODE, job_id=1, attempt=0, started_at=CLOCK, pid=1000)
    launcher.runs[0].exit(0)
    assert sender.finished() == Finished(
        node=NODE,
        job_id=1,
        attempt=0,
        exit_code=0,
        outcome="succeeded",
        finished_at=CLOCK,
        error="",
        started_at=CLOCK,
        log_chunks=1,
    )
    assert sender.log_text() == "hello\n"
    assert launcher.runs[0].released


def test_a_repeated_launch_of_a_running_attempt_only_re_reports_started(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    first = sender.started()
    launch(agent)
    assert len(launcher.runs) == 1
    assert sender.of_type(Started) == [first, first]


def test_a_repeated_launch_of_a_finished_attempt_re_reports_finished(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    launcher.runs[0].exit(2)
    finished = sender.finished()
    assert agent.supervisor.join(5)
    launch(agent)
    assert len(launcher.runs) == 1
    assert sender.of_type(Finished) == [finished, finished]
    assert finished.outcome == "failed"


def test_a_newer_attempt_stops_the_older_one_first_and_never_overlaps_it(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started(1, 0)
    launch(agent, attempt=1)
    old = sender.finished(1, 0)
    assert (old.outcome, old.error) == ("preempted", "superseded by attempt 1")
    sender.started(1, 1)
    assert launcher.runs[0].terminated_with == [3.0]
    assert [(r.job_id, r.attempt) for r in agent.supervisor.running()] == [(1, 1)]


def test_an_attempt_older_than_one_seen_is_refused_as_superseded(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent, attempt=2)
    sender.started(1, 2)
    launch(agent, attempt=1)
    refused = sender.finished(1, 1)
    assert refused.outcome == "superseded"
    assert len(launcher.runs) == 1


def test_a_stop_for_an_attempt_never_seen_reports_it_cancelled(
    agent: Agent, sender: RecordingSender
) -> None:
    stop(agent)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("cancelled", None)
    assert finished.error == "stopped (cancel) before it started on node-h"


def test_a_launch_arriving_after_its_stop_never_starts(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    stop(agent)
    cancelled = sender.finished()
    launch(agent)
    assert launcher.runs == []
    assert sender.of_type(Started) == []
    assert sender.of_type(Finished) == [cancelled, cancelled]


def test_a_stop_of_a_running_attempt_terminates_it_with_the_grace_given(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    stop(agent)
    finished = sender.finished()
    assert launcher.runs[0].terminated_with == [4.0]
    assert (finished.outcome, finished.exit_code, finished.error) == (
        "cancelled",
        143,
        "stopped: cancel",
    )


def test_a_stop_arriving_after_a_natural_exit_keeps_the_real_outcome(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    # Reporting a job that finished on its own as stopped would have the portal run it again.
    launch(agent)
    sender.started()
    run = launcher.runs[0]
    run.code = 0  # exited, but the supervisor has not collected it yet
    stop(agent)
    run.exit(0)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("succeeded", 0)
    assert run.terminated_with == []  # nothing left to signal


@pytest.mark.parametrize(
    ("reason", "code", "result"),
    [
        ("preempt", 0, ("succeeded", "")),
        ("cancel", 0, ("succeeded", "")),
        ("time_limit", 0, ("succeeded", "")),
        ("preempt", 2, ("failed", "exit code 2")),
    ],
)
def test_a_job_that_ended_on_its_own_as_the_stop_went_out_keeps_its_result(
    agent: Agent,
    sender: RecordingSender,
    launcher: ScriptedLauncher,
    reason: str,
    code: int,
    result: tuple[str, str],
) -> None:
    # The job exited a moment before the stop's signal would have reached it (its shim was
    # still sweeping, so the run looked alive): the launcher says no stop reached it.
    launch(agent)
    sender.started()
    launcher.runs[0].ends_before_any_stop(code)
    stop(agent, reason)
    finished = sender.finished()
    assert (finished.outcome, finished.error) == result and finished.exit_code == code


def test_a_job_that_ended_on_its_own_as_the_agent_fenced_keeps_its_result(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent = make_agent(sender, launcher, tmp_path, clock=(clock := Clock()))
    launch(agent)
    sender.started()
    launcher.runs[0].ends_before_any_stop(0)
    clock.now += LEASE_S
    agent.check_lease()
    assert sender.finished().outcome == "succeeded"
    assert agent.supervisor.join(5)


def test_a_stop_after_the_attempt_finished_keeps_the_reported_outcome(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    launcher.runs[0].exit(0)
    assert sender.finished().outcome == "succeeded"
    stop(agent)
    assert [f.outcome for f in sender.of_type(Finished)] == ["succeeded", "succeeded"]
    assert launcher.runs[0].terminated_with == []


def test_a_launcher_error_is_reported_as_launch_error(
    sender: RecordingSender, tmp_path: Path
) -> None:
    agent = make_agent(sender, ScriptedLauncher(fail_with=LaunchError("nope")), tmp_path)
    launch(agent)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code, finished.error) == ("launch_error", None, "nope")
    assert sender.of_type(Started) == []


def test_a_stop_during_start_terminates_the_run_as_soon_as_it_exists(
    sender: RecordingSender, tmp_path: Path
) -> None:
    class GatedLauncher(ScriptedLauncher):
        def __init__(self) -> None:
            super().__init__()
            self.entered = threading.Event()
            self.gate = threading.Event()

        def start(self, launch, *, lease_epoch=None):  # type: ignore[no-untyped-def]
            self.entered.set()
            self.gate.wait(5)
            return super().start(launch, lease_epoch=lease_epoch)

    gated = GatedLauncher()
    agent = make_agent(sender, gated, tmp_path)
    launch(agent)
    assert gated.entered.wait(5)
    stop(agent)
    gated.gate.set()
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("cancelled", 143)
    assert gated.runs[0].terminated_with == [4.0]


# --- queries: the only way a live node makes the portal give up an attempt ---------------------


def test_a_query_for_an_unknown_attempt_says_unknown_and_it_never_runs_afterwards(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    deliver(agent, Query(node=NODE, job_id=1, attempt=0))
    answer = sender.finished()
    assert (answer.outcome, answer.exit_code) == ("unknown", None)
    launch(agent)
    assert launcher.runs == []


def test_a_query_for_a_running_attempt_re_reports_started(
    agent: Agent, sender: RecordingSender
) -> None:
    launch(agent)
    first = sender.started()
    deliver(agent, Query(node=NODE, job_id=1, attempt=0))
    assert sender.of_type(Started) == [first, first]
    assert sender.of_type(Finished) == []


# --- the outbox: at-least-once reporting ------------------------------------------------------


def test_reports_stay_in_the_outbox_until_acknowledged(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    launcher.runs[0].exit(0)
    finished = sender.finished()
    assert agent.supervisor.join(5)
    assert {m.TYPE for m in agent.outbox.pending()} == {"started", "log", "finished"}
    deliver(
        agent,
        Ack(
            node=NODE,
            reports=(finished.report_key(), ReportKey(kind="started", job_id=1, attempt=0)),
        ),
    )
    assert [m.TYPE for m in agent.outbox.pending()] == ["log"]


def test_a_report_the_broker_refused_is_sent_again_until_acknowledged(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent = make_agent(sender, launcher, tmp_path)
    agent.resend_s = 0.0
    sender.broken = ConnectionError("broker down")
    launch(agent)
    while not launcher.runs:
        agent.supervisor.join(0.02)
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)
    assert sender.messages == []
    sender.broken = None
    agent.resend_pending()
    assert [m.TYPE for m in sender.messages] == ["started", "log", "finished"]
    deliver(agent, Ack(node=NODE, reports=tuple(m.report_key() for m in sender.messages)))  # type: ignore[union-attr]
    assert len(agent.outbox) == 0
    agent.resend_pending()
    assert len(sender.messages) == 3


def test_an_unacknowledged_report_is_sent_again_less_and_less_often(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    # A control plane with a backlog acknowledges late: copies sent every 5 s would only
    # lengthen its backlog. The waits double: 5, 10, 20, 40, then 60 s at most.
    launch(agent)
    started = sender.started()
    rid = ("started", started.job_id, started.attempt, 0)
    assert agent._last_sent[rid][1] == 1  # sent once so far
    waits = []
    for _ in range(6):
        last, times = agent._last_sent[rid]
        wait = next(w / 10 for w in range(1, 1000) if agent.resend_due(rid, last + w / 10))
        waits.append(wait)
        agent._last_sent[rid] = (last + wait, times + 1)
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_the_outbox_and_the_journal_survive_a_restart(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    first = make_agent(sender, launcher, tmp_path)
    launch(first)
    sender.started()
    # Its output is reported on its own thread: wait for it, or the outbox may or may not hold it.
    sender.wait_for(lambda m: isinstance(m, LogChunk))
    # The agent dies here (kill -9): nothing more is reported by this run.
    again = RecordingSender()
    second = make_agent(again, ScriptedLauncher(), tmp_path)
    assert [m.TYPE for m in second.outbox.pending()] == ["started", "log"]
    second.supervisor.recover({})
    lost = again.finished()
    assert (lost.outcome, lost.started_at) == ("lost", CLOCK)
    assert "restarted" in lost.error
    launch(second)  # a late launch of the same attempt never runs it again
    assert second.supervisor.join(5)
    assert again.of_type(Started) == []
    launcher.runs[0].exit(0)


def test_a_job_that_ended_while_its_agent_was_down_reports_its_own_result(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    first = make_agent(sender, launcher, tmp_path)
    launch(first)
    sender.started()
    sender.wait_for(lambda m: isinstance(m, LogChunk))  # "hello\n", chunk 0
    # The agent dies (kill -9) just after the job exited; its shim recorded the exit code,
    # which the process launcher hands to the next agent run as an ended run, with the
    # job's output file: the agent had shipped only its first line.
    attempt_dir = tmp_path / "jobs" / "1-0"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / OUTPUT_FILE).write_bytes(b"hello\nthe last line\n")
    again = RecordingSender()
    second = make_agent(again, ScriptedLauncher(), tmp_path)
    second.supervisor.recover({(1, 0): EndedRun(0, pid=1000, attempt_dir=attempt_dir)})
    finished = again.finished()
    assert (finished.outcome, finished.exit_code, finished.started_at) == ("succeeded", 0, CLOCK)
    assert finished.error == "" and finished.log_chunks == 2
    # Chunk 0 again (its mark was the last: a repeat the portal ignores), then the rest.
    assert again.log_text() == "hello\nthe last line\n"
    assert second.supervisor.join(5)
    launcher.runs[0].exit(0)


def test_a_restarted_agent_goes_on_with_the_log_from_its_last_mark(
    sender: RecordingSender, tmp_path: Path
) -> None:
    # The first agent shipped "one\n" as chunk 0 and had marked chunk 1 ("two\n") when it
    # was killed, before the outbox had it; the job went on writing and then ended.
    launcher = ScriptedLauncher(output=[b"one\n"])
    first = make_agent(sender, launcher, tmp_path)
    launch(first)
    sender.started()
    sender.wait_for(lambda m: isinstance(m, LogChunk))
    first.journal.record_log((1, 0), LogMark(seq=1, start=4, end=8))
    attempt_dir = tmp_path / "jobs" / "1-0"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / OUTPUT_FILE).write_bytes(b"one\ntwo\nthree\n")
    again = RecordingSender()
    second = make_agent(again, ScriptedLauncher(), tmp_path)
    second.supervisor.recover({(1, 0): EndedRun(0, pid=1000, attempt_dir=attempt_dir)})
    finished = again.finished()
    assert finished.outcome == "succeeded" and finished.log_chunks == 3
    chunks = [(c.seq, c.data) for c in again.of_type(LogChunk)]
    assert chunks == [(1, "two\n"), (2, "three\n")]  # chunk 0 is the first run's
    assert [(m.seq, m.data) for m in sender.of_type(LogChunk)] == [(0, "one\n")]
    assert second.supervisor.join(5)
    launcher.runs[0].exit(0)


def test_the_heartbeat_lists_running_attempts_and_unacknowledged_finishes(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    launch(agent, job_id=2)
    sender.started(2)
    launcher.runs[1].exit(3)
    done = sender.finished(2)
    assert agent.supervisor.join(0.5) is False  # job 1 still runs
    agent.beat()
    heartbeat = sender.of_type(Heartbeat)[-1]
    assert heartbeat.node == NODE and heartbeat.boot == "boot-1"
    assert heartbeat.address == "10.9.8.7"  # where other hosts reach it (a gang's MASTER_ADDR)
    assert heartbeat.inventory == discover(NODE, source="described")
    assert heartbeat.running == (RunningAttempt(job_id=1, attempt=0, started_at=CLOCK, pid=1000),)
    assert heartbeat.finished == (done,)


def test_a_log_past_the_outbox_bound_is_cut_with_a_note(
    sender: RecordingSender, tmp_path: Path
) -> None:
    launcher = ScriptedLauncher(output=[b"x" * 1000, b"y" * 1000])
    agent = Agent(
        node=NODE,
        inventory=discover(NODE, source="described"),
        launcher=launcher,
        send=sender,
        workdir=tmp_path,
        key=TEST_KEY,
        clock=Clock(),
        outbox_log_bytes=1500,
    )
    grant_lease(agent)
    launch(agent)
    sender.started()
    launcher.runs[0].exit(0)
    sender.finished()
    text = sender.log_text()
    assert text.startswith("x" * 1000)
    assert "1000 bytes of output dropped" in text


# --- the lease and self-fencing ---------------------------------------------------------------


def test_an_agent_without_a_lease_launches_nothing(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent = make_agent(sender, launcher, tmp_path, leased=False)
    launch(agent)
    assert launcher.runs == [] and sender.messages == []
    grant_lease(agent)
    launch(agent)
    sender.started()
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)


def test_an_acknowledged_heartbeat_renews_the_lease_file_from_its_send_time(
    agent: Agent, tmp_path: Path
) -> None:
    lease = read_lease(tmp_path / "lease.json")
    assert lease is not None
    assert (lease.valid_until, lease.boot) == (CLOCK + 0.5 * LEASE_S, "boot-1")


def test_an_ack_for_another_run_of_the_agent_does_not_renew_the_lease(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent = make_agent(sender, launcher, tmp_path, leased=False)
    heartbeat = agent.heartbeat()
    deliver(agent, Ack(node=NODE, boot="boot-0", heartbeat_seq=heartbeat.seq, lease_s=LEASE_S))
    assert not agent.lease.held()


def test_when_the_lease_lapses_the_agent_fences_its_jobs_and_reports_them(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    clock = Clock()
    agent = make_agent(sender, launcher, tmp_path, clock=clock)
    launch(agent)
    sender.started()
    clock.now += 0.5 * LEASE_S - 1
    agent.check_lease()
    assert launcher.runs[0].terminated_with == []
    clock.now += 2
    agent.check_lease()
    fenced = sender.finished()
    assert fenced.outcome == "fenced"
    assert "no acknowledged heartbeat" in fenced.error
    assert launcher.runs[0].terminated_with == [2.0]
    launch(agent, job_id=2)  # no launches while fenced
    assert len(launcher.runs) == 1
    grant_lease(agent)
    launch(agent, job_id=2)
    sender.started(2)
    launcher.runs[1].exit(0)
    assert agent.supervisor.join(5)


def test_a_lease_held_again_after_it_ran_out_is_a_new_epoch_and_its_lapse_is_fenced(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    # The lease ran out and the next ack came before any check saw it (an agent thawed
    # after a freeze): its jobs are fenced all the same, and launches it had accepted before
    # are handed the old epoch, which their watcher refuses (test_process_shim).
    clock = Clock()
    agent = make_agent(sender, launcher, tmp_path, clock=clock)
    launch(agent)
    sender.started()
    assert agent.lease.held_epoch() == 0 and launcher.lease_epochs == [0]
    clock.now += LEASE_S
    assert agent.lease.held_epoch() is None  # ran out: nothing may launch
    grant_lease(agent)
    lease = read_lease(tmp_path / "lease.json")
    assert agent.lease.held_epoch() == 1 and lease is not None and lease.epoch == 1
    agent.check_lease()
    assert sender.finished().outcome == "fenced"
    assert launcher.runs[0].terminated_with == [2.0]
    agent.check_lease()  # once
    assert launcher.runs[0].terminated_with == [2.0]
    launch(agent, job_id=2)
    sender.started(2)
    assert launcher.lease_epochs == [0, 1]
    launcher.runs[1].exit(0)
    assert agent.supervisor.join(5)


def test_a_fence_records_every_stop_before_it_signals_any_run(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    # As in a chaos run: while the fence signals the first job, the second one dies of a
    # SIGKILL from elsewhere. It was fenced all the same: reported fenced, not failed.
    clock = Clock()
    agent = make_agent(sender, launcher, tmp_path, clock=clock)
    for job_id in (1, 2, 3):
        launch(agent, job_id=job_id)
        sender.started(job_id)
    first, second, third = launcher.runs

    def terminate_first(grace_s: float) -> None:
        second.exit(137)
        sender.finished(2)  # its thread has reported it before the fence reaches it
        type(first).terminate(first, grace_s)

    first.terminate = terminate_first  # type: ignore[method-assign]
    clock.now += LEASE_S
    agent.check_lease()
    finished = {f.job_id: (f.outcome, f.exit_code) for f in (sender.finished(j) for j in (1, 2, 3))}
    assert finished == {1: ("fenced", 143), 2: ("fenced", 137), 3: ("fenced", 143)}
    assert first.terminated_with == third.terminated_with == [2.0]
    assert agent.supervisor.join(5)


def test_a_run_its_own_watcher_fenced_is_reported_fenced(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    run = launcher.runs[0]
    run.fenced = lambda: "lease expired at 12:00:00"  # type: ignore[attr-defined]
    run.exit(137)
    finished = sender.finished()
    assert (finished.outcome, finished.exit_code) == ("fenced", 137)
    assert "lease expired" in finished.error


def test_shutdown_reports_running_attempts_preempted_and_refuses_new_launches(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    agent.close(grace_s=1.0)
    finished = sender.finished()
    assert (finished.outcome, finished.error) == ("preempted", "agent on node-h shut down")
    assert sender.of_type(Heartbeat)[-1].running == ()
    launch(agent, job_id=2)
    assert len(launcher.runs) == 1


# --- trust: every message from the portal is signed -------------------------------------------


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda env: {**env, "sig": "0" * 64}, "bad_signature"),
        (lambda env: {"signed": env["signed"]}, "malformed"),
        (lambda env: make_launch(["x"]).to_dict(), "malformed"),  # unsigned
    ],
)
def test_a_launch_that_is_not_signed_by_the_portal_is_refused(
    agent: Agent, launcher: ScriptedLauncher, tamper, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    envelope = sealed(make_launch(["python", "x.py"]), now=CLOCK)
    with caplog.at_level(logging.ERROR, logger="workers.agent"):
        agent.handle(tamper(envelope))
    assert launcher.runs == []
    assert agent.refused[-1] == reason
    assert "refused a message" in caplog.text


def test_a_launch_signed_with_another_nodes_key_or_for_another_node_is_refused(
    agent: Agent, launcher: ScriptedLauncher
) -> None:
    agent.handle(sealed(make_launch(["x"]), key=bytes(32), now=CLOCK))
    agent.handle(sealed(make_launch(["x"], node="node-z"), node="node-z", now=CLOCK))
    agent.handle(sealed(make_launch(["x"], node="node-z"), now=CLOCK))
    assert launcher.runs == []
    assert agent.refused == ["bad_signature", "wrong_node", "wrong_node"]


def test_a_replayed_or_stale_launch_is_refused(
    agent: Agent, launcher: ScriptedLauncher, sender: RecordingSender
) -> None:
    envelope = sealed(make_launch(["x"], job_id=7), now=CLOCK)
    agent.handle(envelope)
    sender.started(7)
    agent.handle(envelope)
    agent.handle(sealed(make_launch(["x"], job_id=8), now=CLOCK - 3600))
    assert agent.refused == ["replay", "stale"]
    assert len(launcher.runs) == 1
    launcher.runs[0].exit(0)


def test_an_agent_refuses_a_report_type_the_portal_never_sends(agent: Agent) -> None:
    agent.handle(
        sealed(Started(node=NODE, job_id=1, attempt=0, started_at=CLOCK, pid=1), now=CLOCK)
    )
    assert agent.refused == ["wrong_direction"]


# --- metrics -----------------------------------------------------------------------------------


def metrics_agent(
    sender: RecordingSender, launcher: ScriptedLauncher, workdir: Path
) -> tuple[Agent, Clock]:
    """An agent on one busy whole GPU (fake NVML), running one job, on a clock the test sets."""
    nvml = FakeNvml([busy_gpu(GPU_0)])
    clock = Clock()
    agent = make_agent(
        sender,
        launcher,
        workdir,
        sampler=NvmlSampler(nvml),
        clock=clock,
        inventory=discover(NODE, source="nvml", nvml=nvml),
    )
    launch(agent)
    sender.started()
    return agent, clock


def gpu_at(at: float) -> DeviceSample:
    return DeviceSample(
        at=at,
        uuid=GPU_0,
        sm_util_pct=87.0,
        mem_util_pct=41.0,
        memory_used_mb=30000,
        memory_total_mb=81920,
        processes=1,
        power_w=312.5,
        temperature_c=61.0,
    )


def job_at(at: float) -> AttemptSample:
    return AttemptSample(
        at=at,
        job_id=1,
        attempt=0,
        sm_util_pct=87.0,
        mem_util_pct=41.0,
        memory_used_mb=30000,
        processes=1,
        power_w=312.5,
        temperature_c=61.0,
    )


def test_metrics_are_sampled_every_metrics_s_and_shipped_in_batches(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent, clock = metrics_agent(sender, launcher, tmp_path)
    for step in (0, 10, 30, 59):  # samples at +0 and +30; the oldest is not 60 s old yet
        clock.now = CLOCK + step
        agent.beat()
    assert sender.of_type(Metrics) == []
    clock.now = CLOCK + 60
    agent.beat()
    assert sender.of_type(Metrics) == [
        Metrics(
            node=NODE,
            devices=tuple(gpu_at(CLOCK + s) for s in (0, 30, 60)),
            attempts=tuple(job_at(CLOCK + s) for s in (0, 30, 60)),
        )
    ]
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)


def test_metrics_the_broker_did_not_take_are_sent_with_the_next_batch(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent, clock = metrics_agent(sender, launcher, tmp_path)
    sender.broken = ConnectionError("broker away")
    for step in (0, 30, 60):
        clock.now = CLOCK + step
        agent.beat()
    sender.broken = None
    clock.now = CLOCK + 90
    agent.beat()
    (batch,) = sender.of_type(Metrics)
    assert [s.at - CLOCK for s in batch.attempts] == [0, 30, 60, 90]
    assert [s.at - CLOCK for s in batch.devices] == [0, 30, 60, 90]
    launcher.runs[0].exit(0)
    assert agent.supervisor.join(5)


def test_an_agent_without_nvml_sends_no_metrics(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    agent.beat()
    agent.ship_metrics(force=True)
    assert sender.of_type(Metrics) == []


def test_log_chunks_are_numbered_per_attempt(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launch(agent)
    sender.started()
    launcher.runs[0].exit(0)
    sender.finished()
    assert [(c.seq, c.data) for c in sender.of_type(LogChunk)] == [(0, "hello\n")]


# --- batches: `launches` in, `reports` out -------------------------------------------------------


def test_a_launches_message_starts_each_of_its_attempts_as_if_each_came_alone(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    launches = tuple(make_launch(["python", "train.py"], job_id=j) for j in (1, 2, 3))
    deliver(agent, Launches(node=NODE, launches=launches))
    for job_id in (1, 2, 3):
        sender.started(job_id=job_id)
    assert len(launcher.runs) == 3
    assert {(e.job_id, e.attempt) for e in agent.journal.unfinished()} == {(1, 0), (2, 0), (3, 0)}
    # Each attempt's own rules still hold: an older attempt than one seen is superseded.
    deliver(agent, Launches(node=NODE, launches=(make_launch(["x"], job_id=1, attempt=5),)))
    older = make_launch(["x"], job_id=1, attempt=4)
    deliver(agent, Launches(node=NODE, launches=(older, make_launch(["x"], job_id=4))))
    assert sender.finished(job_id=1, attempt=4).outcome == "superseded"
    sender.started(job_id=4)


def test_a_launches_message_for_another_node_is_refused_whole(
    agent: Agent, sender: RecordingSender, launcher: ScriptedLauncher
) -> None:
    other = Launches(node="node-x", launches=(make_launch(["x"], node="node-x"),))
    agent.handle(sealed(other, node="node-x", now=agent._clock()))
    assert agent.refused == ["wrong_node"]
    assert launcher.runs == []


class SlowSender(RecordingSender):
    """A broker whose first send waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.in_first_send = threading.Event()
        self.release = threading.Event()
        self._first = True

    def __call__(self, message: Message) -> None:
        if self._first and isinstance(message, Reports):
            self._first = False
            self.in_first_send.set()
            assert self.release.wait(10)
        super().__call__(message)


def test_reports_made_while_a_batch_is_on_its_way_go_together_in_the_next_one(
    launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    sender = SlowSender()
    agent = make_agent(sender, launcher, tmp_path)
    first = threading.Thread(target=agent.report, args=(started_report(1),))
    first.start()
    assert sender.in_first_send.wait(5)
    # The first batch is at the broker: these wait in the outbox, and return at once.
    for job_id in (2, 3, 4):
        assert agent.report(started_report(job_id))
    assert sender.batches == []
    sender.release.set()
    first.join(5)
    assert [[r.job_id for r in batch.reports] for batch in sender.batches] == [[1], [2, 3, 4]]
    assert {r.job_id for r in agent.outbox.pending()} == {1, 2, 3, 4}
    # Each report counts as sent once, so its resend waits the full resend time.
    assert all(agent._last_sent[("started", j, 0, 0)][1] == 1 for j in (1, 2, 3, 4))


def test_a_lone_report_goes_at_once_in_a_batch_of_its_own(agent: Agent, sender: RecordingSender):
    agent.report(started_report(7))
    assert [batch.reports for batch in sender.batches] == [(started_report(7),)]


def test_due_resends_go_in_batches_and_a_refused_batch_stays_for_the_next_round(
    sender: RecordingSender, launcher: ScriptedLauncher, tmp_path: Path
) -> None:
    agent = make_agent(sender, launcher, tmp_path)
    agent.resend_s = 0.0
    sender.broken = ConnectionError("broker down")
    for job_id in range(1, 6):
        agent.report(started_report(job_id))
    assert sender.batches == []
    assert agent.resend_pending() == 0
    sender.broken = None
    assert agent.resend_pending() == 5
    assert [[r.job_id for r in batch.reports] for batch in sender.batches] == [[1, 2, 3, 4, 5]]


def test_the_heartbeat_says_the_agent_takes_launch_batches(agent: Agent) -> None:
    assert agent.heartbeat().launch_batches is True


def started_report(job_id: int) -> Started:
    return Started(node=NODE, job_id=job_id, attempt=0, started_at=CLOCK, pid=1000 + job_id)
