"""``/metrics``: the portal's state in Prometheus's text format, for operators' dashboards.

Everything but request latency is read from the database at scrape time, in a fixed number
of queries (``SCRAPE_QUERIES``) whatever the number of teams, nodes, slices or jobs, so every
web worker answers the same and nothing is lost when a process restarts:

- jobs by team and state, pending jobs by team and reason code, GPU units held by team;
- admissions and preemptions, counted from the jobs' events (they only grow);
- scheduling passes, and their phase timings over the latest ``PASS_TIMINGS_KEPT`` passes;
- nodes' states and heartbeat ages, and the GPU utilisation the agents report per slice.

Access: a scraper with the bearer token ``PORTAL_METRICS_TOKEN``, or one connecting from a
network in ``PORTAL_METRICS_ALLOW`` (loopback by default); anyone else gets a plain 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from portal.cluster.models import Node
from portal.jobs.models import HOLDING_STATES, TERMINAL_STATES, Allocation, Job, JobEvent, JobState
from portal.ops.request_metrics import REQUEST_LATENCY
from portal.scheduling.models import PASS_TIMINGS_KEPT, PassTiming, SchedulerState
from portal.tenants.logins import client_address
from portal.tenants.models import Team

# Queries one scrape makes, whatever the size of the cluster (pinned by the tests).
SCRAPE_QUERIES = 8

# Jobs not yet looked at by a scheduling pass have no reason code yet.
NEW_REASON = "NEW"
OPEN_STATES = tuple(state for state in JobState if state not in TERMINAL_STATES)
PHASES = ("snapshot", "decide", "apply")
PHASE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

FORBIDDEN = "forbidden\n"


# --- access ----------------------------------------------------------------------------------


def scraper_allowed(request: HttpRequest) -> bool:
    """The right bearer token, or a peer address inside ``METRICS_ALLOW``."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return True
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket shows IPv4 peers as ::ffff:a.b.c.d
    return any(address in network for network in settings.METRICS_ALLOW)


@csrf_exempt  # nothing it answers changes state; a POST gets our 403 or 405, not CSRF's page
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not scraper_allowed(request):
        return HttpResponse(FORBIDDEN, status=403, content_type="text/plain; charset=utf-8")
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse("method not allowed; use GET\n", status=405)
        response["Allow"] = "GET, HEAD"
        response["Content-Type"] = "text/plain; charset=utf-8"
        return response
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(scrape_registry()), content_type=content_type)


def scrape_registry() -> CollectorRegistry:
    """The database collector plus request latency: this process's, or, in prometheus_client's
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), every web worker's added up."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if multiprocess_dir:
        MultiProcessCollector(registry, path=multiprocess_dir)
    else:
        registry.register(REQUEST_LATENCY)
    return registry


# --- the collector ----------------------------------------------------------------------------


class PortalCollector(Collector):
    """Reads the database on every scrape; holds nothing between scrapes."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self._now = now

    def collect(self) -> Iterator[Metric]:
        now = self._now or timezone.now()
        teams = list(
            Team.objects.order_by("name").values_list(
                "pk", "name", "guaranteed_units", "limit_units"
            )
        )
        names = {pk: name for pk, name, _, _ in teams}
        yield from _job_gauges(names)
        yield from _team_units(teams)
        yield from _job_counters(names)
        yield from _scheduler_passes()
        yield from _nodes(now)
        yield _slice_utilisation(now)


def _job_gauges(names: dict[int, str]) -> Iterator[Metric]:
    by_state: Counter[tuple[int, str]] = Counter()
    pending: defaultdict[int, Counter[str]] = defaultdict(Counter)
    rows = (
        Job.objects.filter(state__in=OPEN_STATES)
        .values("team_id", "state", "pending_code")
        .annotate(jobs=Count("id"))
        .order_by()
        .values_list("team_id", "state", "pending_code", "jobs")
    )
    for team_id, state, code, jobs in rows:
        by_state[(team_id, state)] += jobs
        if state == JobState.PENDING:
            pending[team_id][code or NEW_REASON] += jobs
    jobs = GaugeMetricFamily(
        "portal_jobs",
        "Jobs not yet ended, by team and state (RUNNING: started on their slices; ASSIGNED: "
        "placed, not started yet).",
        labels=["team", "state"],
    )
    for team_id, name in names.items():
        for state in OPEN_STATES:
            jobs.add_metric([name, state], by_state[(team_id, state)])
    yield jobs
    reasons = GaugeMetricFamily(
        "portal_jobs_pending",
        "PENDING jobs by team and the scheduler's reason code (NEW: no pass has looked at them "
        "yet); a pair with no job is absent.",
        labels=["team", "reason"],
    )
    for team_id, name in names.items():
        for code, count in sorted(pending[team_id].items()):
            reasons.add_metric([name, code], count)
    yield reasons


def _team_units(teams: Sequence[tuple[int, str, float, float | None]]) -> Iterator[Metric]:
    held = dict(
        Allocation.objects.filter(released_at__isnull=True)
        .values("job__team_id")
        .annotate(units=Sum("slice__units"))
        .order_by()
        .values_list("job__team_id", "units")
    )
    units = GaugeMetricFamily(
        "portal_team_gpu_units_held",
        "GPU units held by the team's ASSIGNED and RUNNING jobs (whole GPU 1, MIG g/7, MPS "
        "its share).",
        labels=["team"],
    )
    guaranteed = GaugeMetricFamily(
        "portal_team_gpu_units_guaranteed", "The team's guaranteed GPU units.", labels=["team"]
    )
    limit = GaugeMetricFamily(
        "portal_team_gpu_units_limit",
        "The most GPU units the team may hold (+Inf: no limit).",
        labels=["team"],
    )
    for pk, name, guaranteed_units, limit_units in teams:
        units.add_metric([name], round(held.get(pk) or 0.0, 9))
        guaranteed.add_metric([name], guaranteed_units)
        limit.add_metric([name], float("inf") if limit_units is None else limit_units)
    yield from (units, guaranteed, limit)


def _job_counters(names: dict[int, str]) -> Iterator[Metric]:
    admitted = Q(from_state=JobState.PENDING, to_state=JobState.ASSIGNED)
    preempted = Q(from_state__in=HOLDING_STATES, to_state=JobState.PREEMPTED)
    rows = {
        team_id: (admissions, preemptions)
        for team_id, admissions, preemptions in JobEvent.objects.filter(admitted | preempted)
        .values("job__team_id")
        .annotate(
            admissions=Count("id", filter=admitted),
            preemptions=Count("id", filter=preempted),
        )
        .order_by()
        .values_list("job__team_id", "admissions", "preemptions")
    }
    admissions = CounterMetricFamily(
        "portal_job_admissions",
        "Attempts the scheduler started: PENDING -> ASSIGNED events, by team.",
        labels=["team"],
    )
    preemptions = CounterMetricFamily(
        "portal_job_preemptions",
        "Attempts ended by preemption: ASSIGNED/RUNNING -> PREEMPTED events, by team.",
        labels=["team"],
    )
    for team_id, name in names.items():
        admitted_count, preempted_count = rows.get(team_id, (0, 0))
        admissions.add_metric([name], admitted_count)
        preemptions.add_metric([name], preempted_count)
    yield from (admissions, preemptions)


def _scheduler_passes() -> Iterator[Metric]:
    state = SchedulerState.objects.filter(pk=1).values_list("passes", "finished_at").first()
    passes, finished_at = state or (0, None)
    yield CounterMetricFamily(
        "portal_scheduler_passes", "Scheduling passes that ran (skipped ones not).", value=passes
    )
    last = GaugeMetricFamily(
        "portal_scheduler_last_pass_timestamp_seconds",
        "When the latest scheduling pass finished (Unix time); absent before the first.",
    )
    if finished_at is not None:
        last.add_metric([], finished_at.timestamp())
    yield last
    timings = PassTiming.objects.order_by("-id").values_list(
        "snapshot_ms", "decide_ms", "apply_ms"
    )[:PASS_TIMINGS_KEPT]
    yield phase_histogram(list(timings))


def phase_histogram(timings: Sequence[tuple[float, float, float]]) -> HistogramMetricFamily:
    """Over the latest passes only: read it as it stands (histogram_quantile), not with rate()."""
    family = HistogramMetricFamily(
        "portal_scheduler_pass_phase_seconds",
        f"Duration of each phase of the latest (up to {PASS_TIMINGS_KEPT}) scheduling passes: "
        "snapshot (load), decide (the pure core), apply (write the decisions). A window, not "
        "a running total.",
        labels=["phase"],
    )
    for index, phase in enumerate(PHASES):
        seconds = [row[index] / 1000.0 for row in timings]
        buckets = [
            (floatToGoString(bound), float(sum(1 for s in seconds if s <= bound)))
            for bound in PHASE_BUCKETS_S
        ]
        buckets.append(("+Inf", float(len(seconds))))
        family.add_metric([phase], buckets, sum_value=sum(seconds))
    return family


def _nodes(now: datetime) -> Iterator[Metric]:
    states = GaugeMetricFamily(
        "portal_node_state",
        "1 for the node's state (ready, lost, drained), 0 for the others.",
        labels=["node", "state"],
    )
    ages = GaugeMetricFamily(
        "portal_agent_heartbeat_age_seconds",
        "Seconds since the portal accepted the node's last heartbeat (absent: never).",
        labels=["node"],
    )
    for name, state, last in Node.objects.order_by("name").values_list(
        "name", "state", "last_heartbeat_at"
    ):
        for choice in Node.State:
            states.add_metric([name, choice.value], 1.0 if state == choice else 0.0)
        if last is not None:
            ages.add_metric([name], max(0.0, (now - last).total_seconds()))
    yield from (states, ages)


def _slice_utilisation(now: datetime) -> Metric:
    """The agents' own samples (``metrics`` reports, the latest kept in JobMetrics): a job's
    utilisation is the mean over its GPUs, so it is given to each slice the job holds. MIG
    instances and MPS shares have no utilisation counter; a sample older than
    PORTAL_METRICS_FRESH_S (agents sample and ship in batches) is stale and left out."""
    fresh_after = now - timedelta(seconds=settings.METRICS_FRESH_S)
    rows = (
        Allocation.objects.filter(
            released_at__isnull=True,
            job__state__in=HOLDING_STATES,
            job__attempt=F("attempt"),
            job__metrics__attempt=F("attempt"),
            job__metrics__gpu_util_pct__isnull=False,
            job__metrics__sampled_at__gte=fresh_after,
        )
        .order_by("slice__gpu__node__name", "slice__gpu__index", "slice__key")
        .values_list(
            "slice__gpu__node__name",
            "slice__gpu__index",
            "slice__key",
            "job__metrics__gpu_util_pct",
        )
    )
    family = GaugeMetricFamily(
        "portal_slice_gpu_utilization_ratio",
        "GPU utilisation (0-1) its agent reports for the job holding the slice; absent for idle "
        "slices, MIG instances and MPS shares.",
        labels=["node", "gpu", "slice"],
    )
    for node, gpu_index, key, util_pct in rows:
        family.add_metric([node, str(gpu_index), key], util_pct / 100.0)
    return family
