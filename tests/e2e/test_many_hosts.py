"""Three agents as three hosts, each in a network namespace of its own, over a real network.

The `many_hosts` fixture builds the cluster:

- a network (tests/netns.py): one namespace per host, a veth pair each, all on a bridge in the
  root namespace; the addresses are a /24 of the benchmark block 198.18.0.0/15 that exists
  only on these links (why that block: tests/netns.py). A host's only routes are its loopback
  and that /24: no default route, so nothing but the test's own addresses can be reached;
- a Redis the test starts itself (tests/chaos/backing.py), bound to 127.0.0.1 and to the
  bridge's address only;
- the portal's control plane (worker, beat) in the root namespace on loopback, and one agent
  per host started inside the host's namespace (`nsenter`), reaching the broker at the
  bridge address: the only way it could reach it (tests/stack.py `AgentHost`);
- ground truth outside the portal: each job is tests/chaos/chaos_job.py, which appends its
  start and end to a file of its own; the chaos harness's watcher and checks read them.

Jobs run as the process launcher runs them (as root: other uids, a network namespace of their
own); the test needs root for the namespaces and skips, saying why, where none can be made
(fails instead with PORTAL_REQUIRE_SERVICES=1, as in CI).

Run with `-s` to see what ran where and how long the requeue took (the `many-hosts:` lines).

A gang over two hosts (`gang_hosts`: the same cluster, jobs on their host's network): its
parts meet at the first host's address, as torchrun's would.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chaos import checks
from chaos.backing import PrivateRedis
from chaos.cluster import AGENT_TIMINGS, INVENTORY, PORTAL_TIMINGS, UNITS_PER_NODE
from chaos.harness import job_command
from chaos.truth import Execution, ProcessWatcher, kill_job_processes
from gang_job import RENDEZVOUS, gang_env
from netns import Host, HostNetwork, ip, why_not_possible
from services import require_service
from stack import AgentHost, PortalStack

from portal.cluster.models import Node
from portal.jobs.models import GangPart, Job, JobEvent, JobLogChunk
from portal.jobs.services import job_submit
from portal.jobs.testing import make_team, make_user
from portal.jobs.validation import validate_job_request

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOSTS = ("host-a", "host-b", "host-c")
TEAM = "hosts"
FINAL = set(checks.FINAL_STATES)
JOB_TIMEOUT_S = 150.0


@dataclass
class HostCluster:
    """What a many-hosts test works with; see the module docstring."""

    network: HostNetwork
    hosts: dict[str, Host]  # node name -> its host
    redis: PrivateRedis
    stack: PortalStack
    watcher: ProcessWatcher
    truth_dir: Path
    command: tuple[str, Path]  # interpreter and job script (tests/chaos/chaos_job.py)
    user: Any

    def address_of(self, node: str) -> str:
        return self.hosts[node].address

    def workdirs(self) -> dict[str, str]:
        return {node: str(self.stack.agent_workdir(node)) for node in self.hosts}

    def submit(self, name: str, *, seconds: float, gpu: dict[str, Any], lines: int = 5) -> int:
        """A chaos job, checked and stored as the API would; returns its id."""
        python, script = self.command
        data = {
            "name": name,
            "team": TEAM,
            "image": "python:3.11-slim",
            "command": [python, str(script), str(self.truth_dir), str(lines), f"{seconds:.1f}"],
            "gpu": gpu,
            "preemptible": False,
        }
        return job_submit(user=self.user, request=validate_job_request(data, user=self.user)).pk

    def wait_final(self, job_ids: list[int], timeout_s: float = JOB_TIMEOUT_S) -> list[Job]:
        def final() -> list[Job] | None:
            jobs = list(Job.objects.filter(pk__in=job_ids).select_related("node"))
            return jobs if all(job.state in FINAL for job in jobs) else None

        return self.stack.wait_for(final, timeout_s, f"jobs {job_ids} final")

    def executions(self) -> dict[int, list[Execution]]:
        self.watcher.scan()
        return self.watcher.truth.by_job()

    def host_of(self, execution: Execution) -> str:
        return execution.node(self.workdirs())


@pytest.fixture
def many_hosts(tmp_path: Path, transactional_db: None) -> Iterator[HostCluster]:
    with host_cluster(tmp_path) as cluster:
        yield cluster


@pytest.fixture
def gang_hosts(tmp_path: Path, transactional_db: None) -> Iterator[HostCluster]:
    """The same cluster, with jobs on their host's network (the namespace's: the /24 only)
    instead of one of their own, so a gang's parts reach each other's MASTER_ADDR."""
    with host_cluster(tmp_path, agent_env={"PORTAL_AGENT_JOB_NETWORK": "host"}) as cluster:
        yield cluster


@contextmanager
def host_cluster(tmp_path: Path, agent_env: dict[str, str] | None = None) -> Iterator[HostCluster]:
    reason = why_not_possible()
    if reason:
        require_service(f"network namespaces for the many-hosts test ({reason})")
    team = make_team(TEAM, guaranteed_units=UNITS_PER_NODE * len(HOSTS),
                     limit_units=UNITS_PER_NODE * len(HOSTS))  # fmt: skip
    user = make_user("hosts-user", team=team)
    # Jobs run as other uids: their script and truth files live where any user may pass.
    run_dir = Path(tempfile.mkdtemp(prefix="many-hosts-"))
    run_dir.chmod(0o755)
    truth_dir = run_dir / "truth"
    truth_dir.mkdir()
    truth_dir.chmod(0o1777)
    command = job_command(run_dir)
    watcher: ProcessWatcher | None = None
    try:
        with HostNetwork(HOSTS) as network:
            redis = PrivateRedis(
                run_dir / "redis",
                also_on=(network.broker_address,),
                password=secrets.token_urlsafe(16),
            )
            redis.start()
            try:
                agents = [
                    AgentHost(
                        node=host.name,
                        broker_url=redis.url_at(network.broker_address),
                        argv_prefix=host.enter,
                        env={
                            **AGENT_TIMINGS,
                            **(agent_env or {}),
                            "PORTAL_AGENT_INVENTORY": json.dumps(
                                {"hostname": host.name, **INVENTORY}
                            ),
                        },
                    )
                    for host in network.hosts
                ]
                with PortalStack(
                    tmp_path, agents=agents, broker_url=redis.url, env=PORTAL_TIMINGS
                ) as stack:
                    watcher = ProcessWatcher(truth_dir)
                    watcher.start()
                    yield HostCluster(
                        network=network,
                        hosts={host.name: host for host in network.hosts},
                        redis=redis,
                        stack=stack,
                        watcher=watcher,
                        truth_dir=truth_dir,
                        command=command,
                        user=user,
                    )
            finally:
                if watcher is not None:
                    watcher.stop()
                    kill_job_processes(watcher.truth.executions)
                redis.stop()
        assert not network.leftovers(), f"namespaces or links left: {network.leftovers()}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def say(text: str) -> None:
    print(f"many-hosts: {text}", flush=True)


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
    "    print('reached')\n"
    "except OSError as error:\n"
    "    print('unreachable', error)\n"
)


def connect_from(host: Host, address: str, port: int) -> str:
    done = subprocess.run(  # noqa: S603 - our own argv
        [*host.enter, "python3", "-c", CONNECT, address, str(port)],
        capture_output=True, text=True, timeout=15,
    )  # fmt: skip
    return done.stdout.strip() or done.stderr.strip()


def test_hosts_reach_the_broker_and_each_other_and_nothing_else(
    many_hosts: HostCluster,
) -> None:
    network = many_hosts.network
    subnet = str(network.subnet)
    for host in network.hosts:
        # Main table: the /24 only (no default route); the local table: its own addresses.
        main = [r for r in host.routes() if not r.startswith(("local ", "broadcast "))]
        assert main == [main[0]] and main[0].startswith(f"{subnet} dev "), (host.name, main)
        # No IPv6 beyond the loopback's ::1: nothing leaves a link by IPv6 either.
        six = ip("-n", host.namespace, "-6", "-o", "addr", "show")
        assert [line.split()[1] for line in six.splitlines()] in ([], ["lo"]), six
        assert connect_from(host, network.broker_address, many_hosts.redis.port) == "reached"
        # The machine's own loopback services (PostgreSQL, the shared Redis) are not there.
        assert connect_from(host, "127.0.0.1", many_hosts.redis.port).startswith("unreachable")
    # A rendezvous port on one host is reachable from another (what a gang's ranks need).
    first, second = network.hosts[0], network.hosts[1]
    listener = subprocess.Popen(  # noqa: S603 - our own argv
        [*first.enter, "python3", "-c",
         "import socket, sys\ns = socket.create_server((sys.argv[1], 0))\n"
         "print(s.getsockname()[1], flush=True)\ns.accept()\n", first.address],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        assert connect_from(second, first.address, port) == "reached"
        listener.wait(timeout=10)
    finally:
        listener.kill()
    # Every agent is connected to the broker through the bridge, none through loopback.
    clients = many_hosts.stack.wait_for(
        lambda: _broker_clients_from(many_hosts, {h.address for h in network.hosts}),
        30,
        "every host connected to the broker",
    )
    say(f"network {subnet}: broker {network.broker_address}:{many_hosts.redis.port}; "
        f"hosts {', '.join(f'{h.name}={h.address} (ns {h.namespace})' for h in network.hosts)}; "
        f"broker connections per host address: {clients}")  # fmt: skip


def _broker_clients_from(cluster: HostCluster, addresses: set[str]) -> dict[str, int] | None:
    client = cluster.redis.client()
    try:
        seen: dict[str, int] = {}
        for entry in client.client_list():
            address = entry["addr"].rsplit(":", 1)[0]
            seen[address] = seen.get(address, 0) + 1
    finally:
        client.close()
    unexpected = set(seen) - addresses - {"127.0.0.1"}
    assert not unexpected, f"broker clients from addresses the test never assigned: {seen}"
    return seen if addresses <= set(seen) else None


def test_jobs_spread_over_the_hosts_run_and_finish_once_each(many_hosts: HostCluster) -> None:
    # Six whole GPUs in all (two per host), six jobs at once: every host must take some.
    ids = [
        many_hosts.submit(f"spread-{i}", seconds=8, gpu={"kind": "whole", "count": 1})
        for i in range(6)
    ]
    jobs = many_hosts.wait_final(ids)
    runs = many_hosts.executions()
    for job in sorted(jobs, key=lambda j: j.pk):
        ran = runs.get(job.pk, [])
        say(f"job {job.pk} {job.name}: {job.state} on {job.node.name if job.node else '-'}; "
            f"ground truth: " + ", ".join(
                f"attempt {e.attempt} on {many_hosts.host_of(e)} ({e.how_it_ended})" for e in ran))  # fmt: skip
        assert job.state == "SUCCEEDED", (job.pk, job.state, job.reason)
        assert [e.how_it_ended for e in ran] == ["end"], (job.pk, ran)
        # The portal's record of where it ran is where it really ran.
        assert job.node is not None and many_hosts.host_of(ran[0]) == job.node.name
    used = {many_hosts.host_of(runs[job.pk][0]) for job in jobs}
    assert used == set(HOSTS), f"jobs ran on {sorted(used)} only"
    _assert_truth_checks(many_hosts, jobs)


def test_a_killed_hosts_jobs_are_requeued_onto_the_others_and_none_runs_twice(
    many_hosts: HostCluster,
) -> None:
    # Three one-GPU jobs on six GPUs: whatever the placement, the other hosts have room for
    # every job of the host that dies.
    ids = [
        many_hosts.submit(f"survive-{i}", seconds=20, lines=20, gpu={"kind": "whole", "count": 1})
        for i in range(3)
    ]

    def all_started() -> dict[int, list[Execution]] | None:
        runs = many_hosts.executions()
        return runs if all(job_id in runs for job_id in ids) else None

    runs = many_hosts.stack.wait_for(all_started, JOB_TIMEOUT_S, "every job started")
    placed = {job_id: many_hosts.host_of(runs[job_id][0]) for job_id in ids}
    say("placed: " + ", ".join(f"job {job_id} on {node}" for job_id, node in placed.items()))
    victim = max(HOSTS, key=lambda node: list(placed.values()).count(node))
    moved = [job_id for job_id, node in placed.items() if node == victim]
    killed_at = many_hosts.stack.kill_agent(victim)
    say(f"kill -9 of the agent of {victim} (jobs {moved})")

    jobs = many_hosts.wait_final(ids)
    runs = many_hosts.executions()
    assert Node.objects.get(name=victim).state == Node.State.LOST
    lost_at = {
        event.job_id: event.at.timestamp()
        for event in JobEvent.objects.filter(job_id__in=moved, to_state="LOST")
    }
    for job in sorted(jobs, key=lambda j: j.pk):
        ran = runs[job.pk]
        say(f"job {job.pk}: {job.state}, attempt {job.attempt} on {job.node.name if job.node else '-'}; "
            f"ground truth: " + ", ".join(
                f"attempt {e.attempt} on {many_hosts.host_of(e)} ({e.how_it_ended})" for e in ran))  # fmt: skip
        assert job.state == "SUCCEEDED", (job.pk, job.state, job.reason)
        if job.pk not in moved:
            assert [e.how_it_ended for e in ran] == ["end"], (job.pk, ran)
            continue
        first, *rest = ran
        assert many_hosts.host_of(first) == victim and first.how_it_ended == "killed", first
        assert [e.how_it_ended for e in rest] == ["end"], (job.pk, ran)
        again = rest[0]
        assert many_hosts.host_of(again) != victim and again.attempt > first.attempt, again
        dead = (first.dead_by or killed_at) - killed_at
        say(f"job {job.pk} requeue: killed {dead:+.1f} s after the agent; LOST "
            f"{lost_at[job.pk] - killed_at:+.1f} s; attempt {again.attempt} running on "
            f"{many_hosts.host_of(again)} {again.started - killed_at:+.1f} s; ended "
            f"{(again.end or 0) - killed_at:+.1f} s (lease {PORTAL_TIMINGS['PORTAL_AGENT_LEASE_S']} s)")  # fmt: skip
    _assert_truth_checks(many_hosts, jobs)


def _assert_truth_checks(cluster: HostCluster, jobs: list[Job]) -> None:
    """The chaos harness's checks against the ground truth: no attempt started twice, no two
    executions of a job at once, none ran to its end twice, the portal's results match."""
    truth = cluster.watcher.truth
    rows = {j.pk: checks.JobRow(j.pk, j.name, j.state, j.attempt, j.reason) for j in jobs}
    results = [
        checks.check_attempt_started_once(truth),
        checks.check_no_overlap(checks.find_overlaps(truth, []), cluster.workdirs()),
        checks.check_completed_once(truth, {}),
        checks.check_succeeded_matches_truth(truth, rows),
    ]
    for check in results:
        say(f"{check.verdict} {check.name}: {check.summary}")
    failed = [f"{c.name}: {c.summary} {c.details}" for c in results if c.passed is not True]
    assert not failed, failed


def test_a_gang_over_two_hosts_meets_at_the_first_hosts_address_and_finishes(
    gang_hosts: HostCluster,
) -> None:
    # Four whole GPUs, two per host: at least two hosts, each part on its own namespace.
    data = {"name": "gang", "team": TEAM, "image": "python:3.11-slim",
            "command": ["python3", "-c", RENDEZVOUS], "preemptible": False,
            "gpu": {"kind": "whole", "count": 4, "multi_node": True}}  # fmt: skip
    user = gang_hosts.user
    job_id = job_submit(user=user, request=validate_job_request(data, user=user)).pk

    (job,) = gang_hosts.wait_final([job_id])

    parts = sorted(
        GangPart.objects.filter(job_id=job.pk, attempt=job.attempt), key=lambda p: p.rank
    )
    assert job.state == "SUCCEEDED", (job.state, job.reason)
    assert len(parts) >= 2 and {p.outcome for p in parts} == {"succeeded"}
    nodes = [p.node.name for p in parts]
    assert len(set(nodes)) == len(nodes) and nodes[0] == job.node.name
    logs = [
        "".join(JobLogChunk.objects.filter(job_id=job.pk, attempt=job.attempt, part=p.rank)
                .order_by("seq").values_list("data", flat=True))
        for p in parts
    ]  # fmt: skip
    first = gang_hosts.address_of(nodes[0])
    for part, log in zip(parts, logs, strict=True):
        env = gang_env(log)
        say(f"gang {job.pk} rank {part.rank} on {part.node.name} "
            f"({gang_hosts.address_of(part.node.name)}): " + " ".join(f"{k}={v}" for k, v in env.items()))  # fmt: skip
        assert env["MASTER_ADDR"] == first and env["NODE_RANK"] == str(part.rank), env
        assert env["WORLD_SIZE"] == "4" and env["NNODES"] == str(len(parts)), env
        assert env["PORTAL_GANG_HOSTS"].split(",") == [gang_hosts.address_of(n) for n in nodes]
        if part.rank:
            assert f"node rank {part.rank} heard: welcome" in log, log
    # Rank 0 heard from every other part, over the hosts' network.
    assert logs[0].count("rank 0 met: rank ") == len(parts) - 1, logs[0]
