"""How many control worker processes and threads a portal starts, from the cores."""

from __future__ import annotations

from portal.ops import processes


def test_sqlite_gets_one_control_worker_of_two_threads_whatever_the_cores() -> None:
    for cores in (1, 2, 16):
        assert processes.control_worker_processes(sqlite=True, cores=cores) == 1
        assert processes.control_worker_threads(sqlite=True, cores=cores) == 2


def test_postgres_gets_one_control_worker_per_two_cores_up_to_eight() -> None:
    sizes = {
        cores: (
            processes.control_worker_processes(sqlite=False, cores=cores),
            processes.control_worker_threads(sqlite=False, cores=cores),
        )
        for cores in (1, 2, 4, 8, 16, 32)
    }
    assert sizes == {1: (1, 4), 2: (1, 8), 4: (2, 8), 8: (4, 4), 16: (8, 4), 32: (8, 4)}


def test_each_control_worker_has_its_own_child_and_celery_name() -> None:
    specs = [
        processes.control_worker_spec(instance="local", concurrency=4, env={}, index=index)
        for index in (1, 2, 3)
    ]
    assert [spec.name for spec in specs] == ["worker", "worker-2", "worker-3"]
    names = [spec.argv[spec.argv.index("-n") + 1] for spec in specs]
    assert names == ["control-local@%h", "control-2-local@%h", "control-3-local@%h"]
    for spec in specs:
        assert spec.argv[spec.argv.index("-Q") + 1] == "control.lease,control"
