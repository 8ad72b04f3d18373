"""The job list's SQL compiled once per shape (portal/compiled_queries.py) answers exactly what
the ORM answers, for every user, filter and cursor; a shape it cannot fill is left to the ORM."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal import compiled_queries
from portal.api.serializers import JOB_SUMMARY_COLUMNS
from portal.compiled_queries import compiled_rows, forget_compiled
from portal.jobs.models import Job, JobState
from portal.jobs.selectors import job_list_for_user, job_list_shape
from portal.jobs.testing import World, make_job, token_client
from portal.tenants.selectors import teams_for_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_shapes():
    forget_compiled()
    yield
    forget_compiled()


def _jobs(world: World) -> None:
    start = timezone.now() - timedelta(hours=1)
    states = [JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED]
    people = [(world.vision, world.alice), (world.vision, world.vera), (world.nlp, world.bob)]
    for index in range(24):
        team, user = people[index % len(people)]
        make_job(
            team=team,
            user=user,
            state=states[index % len(states)],
            name=f"train-{index}" if index % 2 else f"eval_{index}%",
            # Pairs share a submit time, so the cursor's tie on the id is walked too.
            submitted_at=start + timedelta(seconds=index // 2),
        )


def _walk(client, query: str) -> list[int]:
    """Every job id of the list, page by page forwards, then back again from the last page."""
    url = f"/api/v1/jobs/?limit=5{query}"
    pages = []
    while url:
        body = client.get(url).json()
        pages.append([row["id"] for row in body["results"]])
        last_previous, url = body["previous"], body["next"]
    forwards = [job_id for page in pages for job_id in page]
    back = pages[-1]
    url = last_previous
    while url:
        body = client.get(url).json()
        back = [row["id"] for row in body["results"]] + back
        url = body["previous"]
    assert back == forwards
    return forwards


QUERIES = [
    "",
    "&state=RUNNING",
    "&state=PENDING,RUNNING",
    "&team=vision",
    "&team=nlp&state=SUCCEEDED,FAILED,RUNNING",
    "&mine=true",
    "&mine=true&state=PENDING",
    "&q=train",
    "&q=_",  # a LIKE wildcard: matched as itself
    "&q=%25",
]


@pytest.mark.parametrize("who", ["alice", "bob", "admin"])
def test_every_page_lists_what_the_orm_lists(who):
    world = World()
    _jobs(world)
    user = getattr(world, who)
    client = token_client(user)
    visible = set(teams_for_user(user=user).values_list("name", flat=True))
    for query in QUERIES:
        params = dict(part.split("=", 1) for part in query.split("&") if part)
        expected = list(
            job_list_for_user(
                user=user,
                state=params["state"].split(",") if "state" in params else None,
                team=params.get("team"),
                mine=params.get("mine") == "true",
                name_contains=params.get("q", "").replace("%25", "%"),
            )
            .order_by("-submitted_at", "-id")
            .values_list("id", flat=True)
        )
        if params.get("team") not in (None, *visible):
            continue  # not the user's team: a 400 (tests/portal/test_api_jobs.py)
        # Twice: the first walk compiles each shape, the second runs what was compiled.
        assert _walk(client, query) == expected, query
        assert _walk(client, query) == expected, query


def test_common_shapes_are_compiled_and_a_search_is_left_to_the_orm():
    world = World()
    _jobs(world)
    client = token_client(world.alice)
    for query in ("", "&state=RUNNING", "&team=vision", "&mine=true", "&q=train"):
        client.get(f"/api/v1/jobs/?limit=5{query}")
    # Kept under (vendor, ((view, job_list_shape's key), direction, limit)).
    searched = {key[1][0][1][6]: [] for key in compiled_queries._shapes}
    for key, shape in compiled_queries._shapes.items():
        searched[key[1][0][1][6]].append(shape)
    assert searched[True] == [None]  # its LIKE pattern is no parameter a stand-in can fill
    assert len(searched[False]) == 4 and None not in searched[False]


def test_rows_are_converted_as_the_orm_converts_them():
    world = World()
    _jobs(world)
    shape = job_list_shape(user=world.alice, state=[JobState.PENDING])

    def build(values):
        return shape.build(values).values(*JOB_SUMMARY_COLUMNS).order_by("-submitted_at", "-id")

    expected = list(build(shape.values))
    assert compiled_rows(key="test", build=build, values=shape.values) == expected
    assert compiled_rows(key="test", build=build, values=shape.values) == expected
    assert compiled_queries._shapes[(compiled_queries.connection.vendor, "test")] is not None


def test_a_value_put_in_the_sql_text_is_not_cached():
    world = World()
    _jobs(world)

    def build(values):
        # A slice's bounds become SQL text, not parameters.
        return Job.objects.order_by("id").values("id")[: values[0]]

    assert len(compiled_rows(key="sliced", build=build, values=[3])) == 3
    assert len(compiled_rows(key="sliced", build=build, values=[5])) == 5
    assert compiled_queries._shapes[(compiled_queries.connection.vendor, "sliced")] is None


@pytest.mark.skipif(
    compiled_queries.connection.vendor != "postgresql", reason="prepared statements: PostgreSQL"
)
def test_an_api_request_runs_its_fixed_statements_prepared_and_logs_them():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    world = World()
    _jobs(world)
    client = token_client(world.alice)

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements ORDER BY statement")
            return [row[0] for row in cursor.fetchall()]

    first = client.get("/api/v1/jobs/?limit=5").json()
    statements = prepared()
    assert any('FROM "tenants_apitoken"' in sql for sql in statements)  # the token lookup
    assert any('INTO "tenants_accesscounter"' in sql for sql in statements)  # rate limits
    assert any('FROM "jobs_job"' in sql for sql in statements)  # the page
    with CaptureQueriesContext(connection) as queries:
        again = client.get("/api/v1/jobs/?limit=5").json()
    # The same statements run again, nothing prepared anew, the answer the same; and the
    # query log still shows each statement's SQL.
    assert prepared() == statements
    assert again == first and len(first["results"]) == 5
    assert all(query["sql"] for query in queries.captured_queries)
    assert any('FROM "jobs_job"' in query["sql"] for query in queries.captured_queries)
