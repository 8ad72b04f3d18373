"""Property tests: random clusters, holdings and queues, invariants every pass must keep."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_builders import MIG, MPS, WHOLE

from scheduler import (
    Cache,
    Carry,
    Decisions,
    Dependency,
    DependencyState,
    GpuRequest,
    Job,
    Node,
    Policy,
    RunningJob,
    RunTimes,
    SchedulerConfig,
    Slice,
    Snapshot,
    Team,
    schedule,
)
from scheduler.order import age_key
from scheduler.runtimes import run_times_from
from scheduler.units import mig_units

NOW = 10_000.0
TEAMS = ("a", "b", "c")
DEPS = ("x", "y")
ARRAYS = ("A", "B")  # job arrays; a throttled one has a limit in Snapshot.array_limits
LAYOUTS = (("3g.40gb", "2g.20gb", "2g.20gb"), ("1g.10gb",) * 7, ("7g.80gb",))
MODELS = ("A100", "H100")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Node, ...]:
    nodes = []
    for n in range(draw(st.integers(1, 5))):
        name = f"n{n}"
        kind = draw(st.sampled_from([WHOLE, WHOLE, MIG, MPS]))
        model = draw(st.sampled_from(MODELS))
        slices: list[Slice] = []
        for g in range(draw(st.integers(2, 6))):
            if kind is WHOLE:
                slices.append(Slice(f"{name}-g{g}", name, f"g{g}", WHOLE, 1.0, model))
            elif kind is MIG:
                for i, p in enumerate(draw(st.sampled_from(LAYOUTS))):
                    slices.append(
                        Slice(f"{name}-g{g}-{i}", name, f"g{g}", MIG, mig_units(p), model, p)
                    )
            else:
                for s in range(4):
                    slices.append(Slice(f"{name}-g{g}-s{s}", name, f"g{g}", MPS, 0.25, model))
        nodes.append(Node(name, tuple(slices), schedulable=draw(st.booleans()) or n == 0))
    return tuple(nodes)


def _request(draw: st.DrawFn, nodes: tuple[Node, ...]) -> GpuRequest:
    template = draw(st.sampled_from([s for n in nodes for s in n.slices]))
    count = draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4, 8]))
    return GpuRequest(
        kind=template.kind,
        count=count,
        profile=template.profile,
        model=draw(st.sampled_from(["", template.model])),
        min_count=draw(st.sampled_from([0, 0, 1, 2])),
        multi_node=draw(st.booleans()),
    )


def _job(draw: st.DrawFn, job_id: str, nodes: tuple[Node, ...]) -> Job:
    return Job(
        id=job_id,
        team=draw(st.sampled_from(TEAMS)),
        user=draw(st.sampled_from(("u1", "u2"))),
        request=_request(draw, nodes),
        submitted_at=float(draw(st.integers(0, 9000))),
        priority=draw(st.sampled_from(("low", "normal", "normal", "high"))),
        time_limit_s=draw(st.sampled_from([None, 600.0, 3600.0, 20000.0])),
        preemptible=draw(st.integers(0, 3)) > 0,
        depends_on=tuple(Dependency(d) for d in draw(st.lists(st.sampled_from(DEPS), max_size=1))),
        array=draw(st.sampled_from(("", "", "", *ARRAYS))),
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = draw(clusters())
    running: list[RunningJob] = []
    free = [s for n in nodes for s in n.slices]
    mps_owner: dict[tuple[str, str], str] = {}
    for k in range(draw(st.integers(0, 10))):
        if not free:
            break
        first = draw(st.sampled_from(free))
        same = [s for s in free if s.node == first.node and s.kind is first.kind]
        same = [s for s in same if s.profile == first.profile]
        held = same[: draw(st.integers(1, max(1, min(2, len(same)))))]
        job = _job(draw, f"r{k}", nodes)
        if first.kind is MPS:
            held = [s for s in held if mps_owner.get((s.node, s.gpu), job.team) == job.team]
            if not held:
                continue
            for s in held:
                mps_owner[(s.node, s.gpu)] = job.team
        free = [s for s in free if s not in held]
        started = float(draw(st.sampled_from([0, 5000, 9000, 9990])))
        grace = NOW - 5.0 if draw(st.integers(0, 9)) == 0 else None
        running.append(
            RunningJob(
                job, first.node, tuple(s.id for s in held), started, draw(st.booleans()), grace
            )
        )
    pending = [_job(draw, f"p{k}", nodes) for k in range(draw(st.integers(0, 12)))]
    teams = {}
    for name in TEAMS:
        teams[name] = Team(
            name,
            weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
            guaranteed=float(draw(st.sampled_from([0, 2, 4, 8]))),
            limit=draw(st.sampled_from([None, None, 3.0, 8.0])),
            max_priority=draw(st.sampled_from(("normal", "high"))),
            usage=float(draw(st.integers(0, 10**7))),
            member_limit=draw(st.sampled_from([None, None, None, 2.0])),
            # A member's own limit (set by a team admin) tightens member_limit.
            member_limits=draw(st.sampled_from([{}, {}, {}, {"u1": 1.0}, {"u2": 3.0}])),
        )
    states = {d: draw(st.sampled_from(list(DependencyState))) for d in DEPS}
    limits = {a: draw(st.integers(1, 3)) for a in ARRAYS if draw(st.booleans())}
    # Run-time history of some jobs shaped like the running and pending ones (estimates only).
    alike = [r.job for r in running] + pending
    finished = [
        (draw(st.sampled_from(alike)), float(draw(st.integers(1, 30000))))
        for _ in range(draw(st.integers(0, 6) if alike else st.just(0)))
    ]
    return Snapshot(
        nodes,
        teams,
        tuple(pending),
        tuple(running),
        dependency_states=states,
        array_limits=limits,
        run_times=run_times_from(finished),
    )


configs = st.builds(
    SchedulerConfig,
    policy=st.sampled_from(list(Policy)),
    backfill=st.booleans(),
    reclaim=st.booleans(),
    preempt_by_priority=st.booleans(),
    clamp_priority=st.booleans(),
    max_reservations=st.integers(0, 2),
    # Jobs submitted 1,000 to 10,000 s before now: some starving at 3,000 s, none at a week.
    max_wait_s=st.sampled_from([None, 7 * 86400.0, 3000.0]),
    # Reclaim that would take a job larger than its team's guarantee may wait for room.
    reclaim_wait_s=st.sampled_from([None, 3 * 3600.0, 2000.0]),
)

# Examples and seeds come from the profile (tests/conftest.py): `ci` (fixed), `deep` (hunting).
PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _slices(snap: Snapshot) -> dict[str, Slice]:
    return {s.id: s for n in snap.nodes for s in n.slices}


@PROPERTY
@given(snapshots(), configs)
def test_no_slice_is_given_twice_or_while_held(snap: Snapshot, config: SchedulerConfig) -> None:
    _check_slices(snap, schedule(snap, now=NOW, config=config))


def _check_slices(snap: Snapshot, decisions: Decisions) -> None:
    """No slice given twice, while held or on a node that takes no work."""
    given_out = [i for a in decisions.assign for i in a.slice_ids]
    held = {i for r in snap.running for i in r.slice_ids}
    assert len(given_out) == len(set(given_out))
    assert not set(given_out) & held
    schedulable = {s.id for n in snap.nodes if n.schedulable for s in n.slices}
    assert set(given_out) <= schedulable


@PROPERTY
@given(snapshots(), configs)
def test_no_team_or_member_goes_above_its_limit(snap: Snapshot, config: SchedulerConfig) -> None:
    _check_limits(snap, schedule(snap, now=NOW, config=config))


def _check_limits(snap: Snapshot, decisions: Decisions) -> None:
    """No team or member above its limit."""
    slices = _slices(snap)
    jobs = {j.id: j for j in snap.pending}
    team_units: Counter[str] = Counter()
    user_units: Counter[tuple[str, str]] = Counter()
    for r in snap.running:
        units = sum(slices[i].units for i in r.slice_ids)
        team_units[r.job.team] += units
        user_units[(r.job.team, r.job.user)] += units
    for a in decisions.assign:
        job = jobs[a.job_id]
        units = sum(slices[i].units for i in a.slice_ids)
        team_units[job.team] += units
        user_units[(job.team, job.user)] += units
        team = snap.teams[job.team]
        if team.limit is not None:
            assert team_units[job.team] <= team.limit + 1e-9
        member_limit = team.limit_of(job.user)
        if member_limit is not None:
            assert user_units[(job.team, job.user)] <= member_limit + 1e-9


@PROPERTY
@given(snapshots(), configs)
def test_gangs_are_whole_matching_and_on_one_node_unless_allowed(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    decisions = schedule(snap, now=NOW, config=config)
    slices = _slices(snap)
    jobs = {j.id: j for j in snap.pending}
    for a in decisions.assign:
        request = jobs[a.job_id].request
        given_out = [slices[i] for i in a.slice_ids]
        assert request.minimum <= len(given_out) <= request.count
        assert {s.kind for s in given_out} == {request.kind}
        if request.profile:
            assert {s.profile for s in given_out} == {request.profile}
        if request.model:
            assert {s.model for s in given_out} == {request.model}
        nodes = {s.node for s in given_out}
        assert nodes == {a.node, *a.nodes}
        assert len(nodes) == 1 or request.multi_node


@PROPERTY
@given(snapshots(), configs)
def test_victims_are_preemptible_old_enough_and_not_already_going(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    decisions = schedule(snap, now=NOW, config=config)
    running = {r.job.id: r for r in snap.running}
    victims = [p.job_id for p in decisions.preempt]
    assert len(victims) == len(set(victims))
    for victim in victims:
        run = running[victim]
        assert run.job.preemptible
        assert run.preempting_since is None
        assert NOW - run.started_at >= config.min_run_time_s
    if config.policy is not Policy.FAIRSHARE:
        assert victims == []


@PROPERTY
@given(snapshots(), configs)
def test_no_array_runs_more_members_than_its_limit(snap: Snapshot, config: SchedulerConfig) -> None:
    decisions = schedule(snap, now=NOW, config=config)
    jobs = {j.id: j for j in snap.pending}
    before = Counter(r.job.array for r in snap.running)
    started = Counter(jobs[a.job_id].array for a in decisions.assign)
    for array, limit in snap.array_limits.items():
        if before[array] >= limit:
            assert started[array] == 0
        else:
            assert before[array] + started[array] <= limit
    for p in decisions.pending:
        if p.reason.code.value == "ARRAY_THROTTLE":
            array = jobs[p.job_id].array
            assert before[array] + started[array] >= snap.array_limits[array]


@PROPERTY
@given(snapshots(), configs)
def test_mps_gpus_never_serve_two_teams(snap: Snapshot, config: SchedulerConfig) -> None:
    decisions = schedule(snap, now=NOW, config=config)
    slices = _slices(snap)
    teams_on: dict[tuple[str, str], set[str]] = {}
    jobs = {j.id: j for j in snap.pending}
    holdings = [(r.job.team, r.slice_ids) for r in snap.running]
    holdings += [(jobs[a.job_id].team, a.slice_ids) for a in decisions.assign]
    for team, ids in holdings:
        for i in ids:
            s = slices[i]
            if s.kind is MPS:
                teams_on.setdefault((s.node, s.gpu), set()).add(team)
    assert all(len(teams) == 1 for teams in teams_on.values())


@PROPERTY
@given(snapshots(), configs)
def test_every_pending_job_gets_exactly_one_outcome_and_a_position(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    decisions = schedule(snap, now=NOW, config=config)
    outcomes = [a.job_id for a in decisions.assign]
    outcomes += [p.job_id for p in decisions.pending] + [f.job_id for f in decisions.fail]
    assert sorted(outcomes) == sorted(j.id for j in snap.pending)
    assert [p.position for p in decisions.pending] == list(range(1, len(decisions.pending) + 1))


@PROPERTY
@given(snapshots(), configs, st.randoms(use_true_random=False))
def test_the_same_input_gives_the_same_decisions(
    snap: Snapshot, config: SchedulerConfig, rng: object
) -> None:
    first = schedule(snap, now=NOW, config=config)
    assert schedule(snap, now=NOW, config=config) == first
    shuffled = list(snap.pending)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    again = schedule(replace(snap, pending=tuple(shuffled)), now=NOW, config=config)
    assert (again.assign, again.preempt, again.pending) == (
        first.assign,
        first.preempt,
        first.pending,
    )
    assert sorted(again.fail, key=lambda f: f.job_id) == sorted(first.fail, key=lambda f: f.job_id)


@PROPERTY
@given(snapshots(), configs)
def test_switching_explanations_off_changes_no_decision(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    explained = schedule(snap, now=NOW, config=config)
    bare = schedule(snap, now=NOW, config=SchedulerConfig(**{**_fields(config), "explain": False}))
    assert (bare.assign, bare.preempt, bare.fail) == (
        explained.assign,
        explained.preempt,
        explained.fail,
    )
    assert sorted(p.job_id for p in bare.pending) == sorted(p.job_id for p in explained.pending)
    # Nor listing no pending job (the simulator's pass, where a reservation that could set
    # nothing aside is not computed).
    lean = schedule(snap, now=NOW, config=replace(config, explain=False, list_pending=False))
    assert (lean.assign, lean.preempt, lean.fail) == (bare.assign, bare.preempt, bare.fail)
    assert lean.pending == ()


@PROPERTY
@given(snapshots(), configs, st.booleans())
def test_a_queue_declared_in_submit_order_is_taken_as_the_sorted_one(
    snap: Snapshot, config: SchedulerConfig, listing: bool
) -> None:
    # Snapshot.pending_in_submit_order: the shell's promise spares the FIFO baselines their
    # sort; kept, every decision, reason and position is what the core's own sort gives.
    config = replace(config, explain=listing, list_pending=listing)
    in_order = replace(snap, pending=tuple(sorted(snap.pending, key=age_key)))
    sorted_by_core = schedule(in_order, now=NOW, config=config)
    declared = replace(in_order, pending_in_submit_order=True)
    assert schedule(declared, now=NOW, config=config) == sorted_by_core


@PROPERTY
@given(snapshots(), configs, st.booleans())
def test_the_shells_index_of_the_queue_decides_as_the_walk_and_a_false_one_keeps_limits(
    snap: Snapshot, config: SchedulerConfig, listing: bool
) -> None:
    # Snapshot.pending_groups: with the true (team, user, priority) of the pending jobs the
    # core decides exactly as when it walks the queue for them; a false index (some groups
    # left out, one made up) may change the order, never break a limit.
    config = replace(config, explain=listing, list_pending=listing)
    groups = {(j.team, j.user, j.priority) for j in snap.pending}
    walked = schedule(snap, now=NOW, config=config)
    indexed = replace(snap, pending_groups=tuple(sorted(groups)))
    decided = schedule(indexed, now=NOW, config=config)
    assert decided == walked
    assert decided.standing == walked.standing  # (not part of a Decisions' equality)
    false = replace(snap, pending_groups=(*sorted(groups)[1:], ("c", "nobody", "high")))
    decided = schedule(false, now=NOW, config=config)
    _check_slices(false, decided)
    _check_limits(false, decided)


def _fields(config: SchedulerConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in SchedulerConfig.__dataclass_fields__}


@PROPERTY
@given(
    snapshots(),
    configs,
    st.sampled_from([(True, True), (False, True), (False, False)]),
    st.frozensets(st.sampled_from(list(Cache))),
)
def test_no_decision_depends_on_a_cache(
    snap: Snapshot,
    config: SchedulerConfig,
    listing: tuple[bool, bool],
    kept: frozenset[Cache],
) -> None:
    # Every cache pays only in time: with all of them off, or only some on, every decision,
    # reason, number, position and estimate is the same; also without explanations, and
    # without a pending list (the simulator's passes). (Twice with all on, so the node-list
    # cache is hit too.)
    explain, list_pending = listing
    config = replace(config, explain=explain, list_pending=list_pending)
    cached = schedule(snap, now=NOW, config=config)
    assert schedule(snap, now=NOW, config=config) == cached
    assert schedule(snap, now=NOW, config=replace(config, caches=frozenset())) == cached
    assert schedule(snap, now=NOW, config=replace(config, caches=kept)) == cached


def _rebuilt(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """New node and slice objects of equal value, as the shell reads them every pass."""
    return tuple(Node(n.name, tuple(replace(s) for s in n.slices), n.schedulable) for n in nodes)


@PROPERTY
@given(snapshots(), configs)
def test_a_kept_node_list_answers_as_a_fresh_one_and_a_changed_one_is_rebuilt(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    # The node-list cache keeps the shape while each pass brings a new tuple equal to the last
    # one: every decision is the one of a shape built afresh, when it is kept (the second
    # pass) and when the node list changes (a node drained; and from one example to the
    # next, whole other clusters).
    fresh = replace(config, caches=frozenset(Cache) - {Cache.NODE_LIST})
    drained = replace(snap, nodes=(replace(snap.nodes[0], schedulable=False), *snap.nodes[1:]))
    expected = {id(s): schedule(s, now=NOW, config=fresh) for s in (snap, drained)}
    for each in (snap, snap, drained):
        again = replace(each, nodes=_rebuilt(each.nodes))
        assert schedule(again, now=NOW, config=config) == expected[id(each)]


@PROPERTY
@given(snapshots(), configs)
def test_run_time_history_changes_no_decision_and_every_band_is_ordered(
    snap: Snapshot, config: SchedulerConfig
) -> None:
    with_history = schedule(snap, now=NOW, config=config)
    blind = schedule(replace(snap, run_times=RunTimes()), now=NOW, config=config)
    assert (blind.assign, blind.preempt, blind.fail) == (
        with_history.assign,
        with_history.preempt,
        with_history.fail,
    )
    assert [(p.job_id, p.reason, p.position) for p in blind.pending] == [
        (p.job_id, p.reason, p.position) for p in with_history.pending
    ]
    for p in with_history.pending:
        known = [v for v in (p.eta_earliest, p.eta, p.eta_latest) if v is not None]
        assert known == sorted(known), p
        assert all(v >= NOW for v in known), p
        if p.eta is not None:
            assert p.eta_earliest is not None, p


@st.composite
def reclaim_of_oversized_jobs(draw: st.DrawFn) -> Snapshot:
    """Team o (1 GPU of guarantee) fills whole nodes with 2- to 4-GPU gangs, each larger than
    its guarantee, of various ages and time limits; teams a and b, within their guarantees,
    queue small jobs queued at various times: the reclaims that may wait for room
    (``reclaim_wait_s``), which the general snapshots above seldom reach."""
    nodes = tuple(
        Node(
            f"n{n}",
            tuple(Slice(f"n{n}-g{g}", f"n{n}", f"g{g}", WHOLE, 1.0, "A100") for g in range(4)),
        )
        for n in range(draw(st.integers(1, 3)))
    )
    running = []
    for node in nodes:
        left = list(node.slices)
        while left:
            size = min(len(left), draw(st.sampled_from([2, 3, 4])))
            held, left = left[:size], left[size:]
            gang = Job(
                id=f"o-{held[0].id}",
                team="o",
                user="u",
                request=GpuRequest(WHOLE, len(held)),
                submitted_at=0.0,
                time_limit_s=draw(st.sampled_from([None, 1000.0, 3000.0, 6000.0, 20000.0])),
            )
            started = float(draw(st.sampled_from([0, 5000, 9000, 9900])))
            running.append(RunningJob(gang, node.name, tuple(s.id for s in held), started, True))
    pending = [
        Job(
            id=f"p{k}",
            team=draw(st.sampled_from(("a", "b"))),
            user=draw(st.sampled_from(("u1", "u2"))),
            request=GpuRequest(WHOLE, draw(st.sampled_from([1, 1, 2]))),
            # Queued long ago (its reclaim_wait_s over) or just now, often in the same pass.
            submitted_at=draw(st.sampled_from([0.0, 5000.0, 8000.0, 9500.0, 9990.0])),
            time_limit_s=draw(st.sampled_from([None, 600.0, 3600.0])),
        )
        for k in range(draw(st.integers(1, 8)))
    ]
    teams = {
        "o": Team("o", guaranteed=1.0),
        "a": Team("a", guaranteed=4.0, usage=float(draw(st.integers(0, 10**6)))),
        "b": Team("b", guaranteed=3.0, usage=float(draw(st.integers(0, 10**6)))),
    }
    usage = {("a", "u2"): float(draw(st.integers(0, 10**6)))}
    return Snapshot(nodes, teams, tuple(pending), tuple(running), user_usage=usage)


@PROPERTY
@given(
    reclaim_of_oversized_jobs(),
    st.sampled_from([None, 600.0, 3000.0, 3 * 3600.0]),
    st.integers(0, 2),
    st.sampled_from([(True, True), (False, True), (False, False)]),
    # Past the maximum wait, the jobs queued before 8,000 s: each holds a reservation of its
    # own, which sets nothing aside in the full cluster (the simulator's passes keep that
    # as the verdict of the starving jobs alike).
    st.sampled_from([None, 2000.0]),
    st.frozensets(st.sampled_from(list(Cache))),
)
def test_no_decision_of_a_reclaim_that_waits_for_room_depends_on_a_cache(
    snap: Snapshot,
    reclaim_wait_s: float | None,
    max_reservations: int,
    listing: tuple[bool, bool],
    max_wait_s: float | None,
    kept: frozenset[Cache],
) -> None:
    explain, list_pending = listing
    config = SchedulerConfig(
        reclaim_wait_s=reclaim_wait_s,
        max_reservations=max_reservations,
        explain=explain,
        list_pending=list_pending,
        max_wait_s=max_wait_s,
    )
    cached = schedule(snap, now=NOW, config=config)
    assert schedule(snap, now=NOW, config=replace(config, caches=frozenset())) == cached
    assert schedule(snap, now=NOW, config=replace(config, caches=kept)) == cached
    # Only reclaim preempts here, and only o borrows.
    assert all(p.reason == "reclaim" and p.job_id.startswith("o-") for p in cached.preempt)


@st.composite
def pass_sequences(draw: st.DrawFn) -> list[Snapshot]:
    """Snapshots of passes that follow one another, as a portal or a replay meets them: each
    one the last one changed a little (jobs added, removed or changed, the last pass's
    decisions applied, running jobs ended, nodes changed), what did not change kept as the
    same objects."""
    snap = draw(snapshots())
    sequence = [snap]
    for step in range(draw(st.integers(1, 4))):
        pending = list(snap.pending)
        running = list(snap.running)
        nodes = snap.nodes
        teams = dict(snap.teams)
        for change in draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)):
            if change == 0:  # arrivals
                pending += [
                    _job(draw, f"s{step}-{k}", nodes) for k in range(draw(st.integers(1, 3)))
                ]
            elif change == 1 and pending:  # a pending job leaves (cancelled)
                del pending[draw(st.integers(0, len(pending) - 1))]
            elif change == 2 and pending:  # a pending job's row changed: a new object
                k = draw(st.integers(0, len(pending) - 1))
                old = pending[k]
                pending[k] = replace(
                    old,
                    request=_request(draw, nodes),
                    priority=draw(st.sampled_from(("low", "normal", "high"))),
                )
            elif change == 3 and running:  # a running job ended
                del running[draw(st.integers(0, len(running) - 1))]
            elif change == 4 and running:  # a running job is being stopped: a new object
                k = draw(st.integers(0, len(running) - 1))
                running[k] = replace(running[k], preempting_since=NOW - 1.0)
            elif change == 5:  # the last pass's starts applied
                decided = schedule(snap, now=NOW, config=SchedulerConfig())
                started = {a.job_id: a for a in decided.assign}
                running += [
                    RunningJob(j, started[j.id].node, started[j.id].slice_ids, NOW)
                    for j in pending
                    if j.id in started
                ]
                pending = [j for j in pending if j.id not in started]
            elif change == 6:  # a node drained, or back
                k = draw(st.integers(0, len(nodes) - 1))
                drained = replace(nodes[k], schedulable=not nodes[k].schedulable or k == 0)
                nodes = (*nodes[:k], drained, *nodes[k + 1 :])
            elif change == 7:  # the same nodes read anew from the database
                nodes = _rebuilt(nodes)
            elif change == 8 and len(nodes) > 1:  # a node lost
                nodes = nodes[:-1]
            elif change == 9:  # a team's record: new usage, perhaps another highest class
                name = draw(st.sampled_from(TEAMS))
                teams[name] = replace(
                    teams[name],
                    usage=teams[name].usage + 1000.0,
                    max_priority=draw(st.sampled_from(("normal", "high"))),
                )
        snap = replace(
            snap, nodes=nodes, teams=teams, pending=tuple(pending), running=tuple(running)
        )
        sequence.append(snap)
    return sequence


@PROPERTY
@given(pass_sequences(), configs, st.booleans(), st.frozensets(st.sampled_from(list(Cache))))
def test_no_decision_depends_on_what_a_pass_carries_over(
    sequence: list[Snapshot], config: SchedulerConfig, explain: bool, kept: frozenset[Cache]
) -> None:
    # Pass after pass with one Carry (every cache on, and only some), every decision, reason,
    # number, position and estimate is that of a pass with every cache off and nothing
    # carried over, whatever changed in between; the grace period changes once, and so do
    # the class rules.
    config = replace(config, explain=explain)
    carry, some = Carry(), Carry()
    for k, snap in enumerate(sequence):
        each = config
        if k == 2:
            each = replace(config, grace_period_s=60.0)
        elif k == 3:
            each = replace(
                config,
                preempt_by_priority=not config.preempt_by_priority,
                clamp_priority=not config.clamp_priority,
            )
        expected = schedule(snap, now=NOW, config=replace(each, caches=frozenset()))
        assert schedule(snap, now=NOW, config=each, carry=carry) == expected
        assert schedule(snap, now=NOW, config=replace(each, caches=kept), carry=some) == expected
