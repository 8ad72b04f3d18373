"""GPU samples through NVML (workers.metrics), with the fake NVML: exact readings of a whole
GPU, a GPU in MIG mode and its instances, an MPS GPU and its clients' owners, an NVML error;
the batch that waits for the broker; the settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_doubles import NODE
from fake_nvml import FakeGpu, FakeMig, FakeNvml, FakeProcess, busy_gpu

from workers.inventory import discover
from workers.metrics import MetricsBatch, NvmlSampler, ProcessOwners
from workers.protocol import (
    METRICS_MAX_SAMPLES,
    AttemptSample,
    Device,
    DeviceSample,
    Launch,
    Metrics,
    ProtocolError,
    RunningAttempt,
    parse,
)
from workers.settings import AgentSettings, SettingsError
from workers.signing import key_to_text

AT = 1_700_000_000.0
WHOLE = "GPU-11111111-0000-4000-8000-000000000000"
PARENT = "GPU-22222222-0000-4000-8000-000000000000"
MPS = "GPU-33333333-0000-4000-8000-000000000000"
LOST = "GPU-44444444-0000-4000-8000-000000000000"
MIG_A = "MIG-aaaaaaaa-0000-4000-8000-000000000000"
MIG_B = "MIG-bbbbbbbb-0000-4000-8000-000000000000"


def mig(uuid: str, slot: int, *, used_mb: int, pids: list[int]) -> FakeMig:
    return FakeMig(
        uuid=uuid,
        profile_id=9,
        gpu_instance_id=slot + 1,
        gpu_slices=3,
        compute_slices=3,
        memory_mb=40192,
        name="MIG 3g.40gb",
        used_mb=used_mb,
        processes=[FakeProcess(pid=p, used_mb=None) for p in pids],
    )


def host() -> FakeNvml:
    return FakeNvml(
        [
            busy_gpu(WHOLE),
            FakeGpu(
                uuid=PARENT,
                mig_enabled=True,
                used_mb=12000,
                power_mw=95_250,
                temperature_c=44,
                mig_slots=[
                    mig(MIG_A, 0, used_mb=9000, pids=[501, 502]),
                    mig(MIG_B, 1, used_mb=0, pids=[]),
                ],
            ),
            FakeGpu(
                uuid=MPS,
                mig_capable=False,
                used_mb=7000,
                util_pct=35,
                mem_util_pct=12,
                power_mw=150_000,
                temperature_c=50,
                mps_server_pid=900,
                mps_clients=[
                    FakeProcess(pid=7001, used_mb=2000),
                    FakeProcess(pid=7002, used_mb=1500),
                    FakeProcess(pid=8001, used_mb=3000),
                ],
            ),
        ]
    )


def inventory_of(nvml: FakeNvml):  # type: ignore[no-untyped-def]
    return discover(NODE, source="nvml", nvml=nvml, mps_shares=f"{MPS}=4")


def launch(job_id: int, *devices: Device) -> Launch:
    return Launch(
        node=NODE,
        job_id=job_id,
        attempt=1,
        name=f"job-{job_id}",
        team="vision",
        user="alice",
        image="img",
        command=("run",),
        env={},
        devices=devices,
    )


def whole(uuid: str, index: int = 0) -> Device:
    return Device(slice_id=uuid, kind="whole", gpu_uuid=uuid, gpu_index=index)


def mig_slice(uuid: str) -> Device:
    return Device(
        slice_id=uuid, kind="mig", gpu_uuid=PARENT, gpu_index=1, mig_uuid=uuid, profile="3g.40gb"
    )


def share(i: int) -> Device:
    return Device(
        slice_id=f"{MPS}/mps/{i}", kind="mps", gpu_uuid=MPS, gpu_index=2, mps_fraction=0.25
    )


def running(launch: Launch, pid: int | None = None) -> tuple[Launch, RunningAttempt]:
    return launch, RunningAttempt(job_id=launch.job_id, attempt=launch.attempt, pid=pid)


def owners(table: dict[int, tuple[int, int]]):  # type: ignore[no-untyped-def]
    return lambda pid: table.get(pid)


def test_a_whole_gpu_and_its_job_get_every_reading_nvml_offers() -> None:
    nvml = host()
    job = launch(1, whole(WHOLE))

    devices, attempts = NvmlSampler(nvml).sample(
        inventory=inventory_of(nvml), running=[running(job)], at=AT, owners=owners({})
    )

    assert devices[0] == DeviceSample(
        at=AT,
        uuid=WHOLE,
        sm_util_pct=87.0,
        mem_util_pct=41.0,
        memory_used_mb=30000,
        memory_total_mb=81920,
        processes=1,
        power_w=312.5,
        temperature_c=61.0,
    )
    assert attempts == [
        AttemptSample(
            at=AT,
            job_id=1,
            attempt=1,
            sm_util_pct=87.0,
            mem_util_pct=41.0,
            memory_used_mb=30000,
            processes=1,
            power_w=312.5,
            temperature_c=61.0,
        )
    ]


def test_on_mig_the_instances_give_memory_and_processes_and_the_gpu_its_power() -> None:
    nvml = host()
    job = launch(2, mig_slice(MIG_A))

    devices, attempts = NvmlSampler(nvml).sample(
        inventory=inventory_of(nvml), running=[running(job)], at=AT, owners=owners({})
    )

    by_uuid = {d.uuid: d for d in devices}
    # Utilisation is not supported on a GPU in MIG mode: power, temperature and memory are.
    assert by_uuid[PARENT] == DeviceSample(
        at=AT,
        uuid=PARENT,
        memory_used_mb=12000,
        memory_total_mb=81920,
        processes=2,
        power_w=95.25,
        temperature_c=44.0,
    )
    assert by_uuid[MIG_A] == DeviceSample(
        at=AT, uuid=MIG_A, memory_used_mb=9000, memory_total_mb=40192, processes=2
    )
    assert by_uuid[MIG_B] == DeviceSample(
        at=AT, uuid=MIG_B, memory_used_mb=0, memory_total_mb=40192, processes=0
    )
    # The job gets its instance's memory and processes; no utilisation, and not the GPU's
    # power (its neighbours draw it too).
    assert attempts == [AttemptSample(at=AT, job_id=2, attempt=1, memory_used_mb=9000, processes=2)]


def test_an_mps_gpu_counts_its_clients_and_each_job_gets_only_its_own() -> None:
    nvml = host()
    mine, neighbour, idle = launch(7, share(0), share(1)), launch(8, share(2)), launch(9, share(3))
    table = {7001: (7, 1), 7002: (7, 1), 8001: (8, 1)}

    devices, attempts = NvmlSampler(nvml).sample(
        inventory=inventory_of(nvml),
        running=[running(mine), running(neighbour), running(idle)],
        at=AT,
        owners=owners(table),
    )

    assert {d.uuid: d for d in devices}[MPS] == DeviceSample(
        at=AT,
        uuid=MPS,
        sm_util_pct=35.0,
        mem_util_pct=12.0,
        memory_used_mb=7000,
        memory_total_mb=81920,
        processes=4,  # the MPS server and its three clients
        mps_clients=3,
        power_w=150.0,
        temperature_c=50.0,
    )
    # Two jobs share the GPU: its utilisation is neither's alone. A job with no client
    # there uses none of it.
    assert attempts == [
        AttemptSample(at=AT, job_id=7, attempt=1, memory_used_mb=3500, processes=2),
        AttemptSample(at=AT, job_id=8, attempt=1, memory_used_mb=3000, processes=1),
        AttemptSample(
            at=AT,
            job_id=9,
            attempt=1,
            sm_util_pct=0.0,
            mem_util_pct=0.0,
            memory_used_mb=0,
            processes=0,
        ),
    ]


def test_the_only_job_on_an_mps_gpu_gets_its_utilisation() -> None:
    nvml = host()
    nvml.gpus[2].mps_clients = nvml.gpus[2].mps_clients[:2]
    job = launch(7, share(0))

    _, attempts = NvmlSampler(nvml).sample(
        inventory=inventory_of(nvml),
        running=[running(job)],
        at=AT,
        owners=owners({7001: (7, 1), 7002: (7, 1)}),
    )

    assert attempts == [
        AttemptSample(
            at=AT,
            job_id=7,
            attempt=1,
            sm_util_pct=35.0,
            mem_util_pct=12.0,
            memory_used_mb=3500,
            processes=2,
        )
    ]


def test_an_mps_client_of_nobody_known_leaves_the_jobs_readings_null() -> None:
    nvml = host()
    job = launch(7, share(0))

    _, attempts = NvmlSampler(nvml).sample(
        inventory=inventory_of(nvml),
        running=[running(job)],
        at=AT,
        owners=owners({7001: (7, 1), 7002: (7, 1)}),  # 8001: another PID namespace
    )

    assert attempts == [AttemptSample(at=AT, job_id=7, attempt=1)]


def test_a_lost_gpu_is_sampled_with_its_error_and_the_others_still_are() -> None:
    nvml = host()
    nvml.gpus.append(FakeGpu(uuid=LOST, mig_capable=False, util_pct=90))
    inventory = inventory_of(nvml)
    nvml.gpus[3].lost = True  # fell off the bus after discovery
    on_lost, on_whole = launch(3, whole(LOST, 3)), launch(1, whole(WHOLE))

    devices, attempts = NvmlSampler(nvml).sample(
        inventory=inventory, running=[running(on_lost), running(on_whole)], at=AT, owners=owners({})
    )

    by_uuid = {d.uuid: d for d in devices}
    assert by_uuid[LOST] == DeviceSample(at=AT, uuid=LOST, error="NVML: GPU is lost")
    assert by_uuid[WHOLE].sm_util_pct == 87.0
    assert attempts[0] == AttemptSample(at=AT, job_id=3, attempt=1)
    assert attempts[1].sm_util_pct == 87.0


def test_a_device_gone_from_nvml_is_sampled_as_not_found() -> None:
    nvml = host()
    inventory = inventory_of(nvml)
    nvml.gpus[1].mig_slots[1] = None  # the instance was destroyed (MIG reconfiguration)

    devices, _ = NvmlSampler(nvml).sample(inventory=inventory, running=[], at=AT)

    assert {d.uuid: d for d in devices}[MIG_B] == DeviceSample(
        at=AT, uuid=MIG_B, error="NVML: Not Found"
    )


# --- who owns a pid --------------------------------------------------------------------------


def write_proc(root: Path, pid: int, *, pgid: int, sid: int, cgroup: str = "0::/\n") -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    # comm may hold spaces and parentheses: fields are counted after its closing one.
    (entry / "stat").write_text(f"{pid} (python (train) x) S 1 {pgid} {sid} 0 -1 4194560 0\n")
    (entry / "cgroup").write_text(cgroup)


def test_a_pid_belongs_to_the_attempt_of_its_process_group_session_or_container(
    tmp_path: Path,
) -> None:
    write_proc(tmp_path, 5001, pgid=5000, sid=5000)  # a child in the job's process group
    write_proc(tmp_path, 5002, pgid=5002, sid=5000)  # moved to its own group: same session
    write_proc(tmp_path, 6001, pgid=6001, sid=6001, cgroup="0::/system.slice/docker-c0ffee.scope\n")
    write_proc(tmp_path, 7001, pgid=7001, sid=7001)
    owner_of = ProcessOwners(
        [
            RunningAttempt(job_id=1, attempt=2, pid=5000),
            RunningAttempt(job_id=3, attempt=0, container_id="c0ffee"),
        ],
        proc=tmp_path,
    )

    assert [owner_of(pid) for pid in (5000, 5001, 5002, 6001, 7001, 9999)] == [
        (1, 2),
        (1, 2),
        (1, 2),
        (3, 0),
        None,
        None,
    ]


def test_the_sampler_finds_mps_clients_owners_in_proc(tmp_path: Path) -> None:
    nvml = host()
    nvml.gpus[2].mps_clients = [FakeProcess(pid=7001, used_mb=2000)]
    write_proc(tmp_path, 7001, pgid=7000, sid=7000)
    job = launch(7, share(0))

    _, attempts = NvmlSampler(nvml, proc=tmp_path).sample(
        inventory=inventory_of(nvml), running=[running(job, pid=7000)], at=AT
    )

    assert (attempts[0].processes, attempts[0].memory_used_mb, attempts[0].sm_util_pct) == (
        1,
        2000,
        35.0,
    )


# --- batches ---------------------------------------------------------------------------------


def sample_at(at: float) -> AttemptSample:
    return AttemptSample(at=at, job_id=1, attempt=0, sm_util_pct=1.0)


def test_a_batch_hands_out_the_oldest_first_and_takes_back_what_was_not_sent() -> None:
    batch = MetricsBatch()
    batch.add([DeviceSample(at=2.0, uuid=WHOLE)], [sample_at(1.0), sample_at(2.0)])

    devices, attempts = batch.take(2)
    assert (devices, attempts) == ([], [sample_at(1.0), sample_at(2.0)])
    batch.restore(devices, attempts)
    assert len(batch) == 3 and batch.oldest() == 1.0
    assert batch.take() == ([DeviceSample(at=2.0, uuid=WHOLE)], [sample_at(1.0), sample_at(2.0)])
    assert len(batch) == 0 and batch.oldest() is None


def test_a_full_batch_drops_its_oldest_samples() -> None:
    batch = MetricsBatch(limit=3)
    batch.add([], [sample_at(t) for t in (1.0, 2.0, 3.0, 4.0, 5.0)])

    assert batch.take() == ([], [sample_at(3.0), sample_at(4.0), sample_at(5.0)])
    assert batch.dropped == 2


def test_a_metrics_message_is_bounded_and_versioned() -> None:
    one = sample_at(1.0).to_dict()
    message = Metrics(node=NODE, attempts=(sample_at(1.0),)).to_dict()
    half = METRICS_MAX_SAMPLES // 2

    with pytest.raises(ProtocolError) as caught:
        parse({**message, "attempts": [one] * (METRICS_MAX_SAMPLES + 1)})
    assert (caught.value.field, caught.value.problem) == (
        "metrics.attempts",
        f"Expected `array` of length <= {METRICS_MAX_SAMPLES}",
    )
    device = DeviceSample(at=1.0, uuid=WHOLE).to_dict()
    with pytest.raises(ProtocolError) as caught:
        parse({**message, "attempts": [one] * (half + 1), "devices": [device] * half})
    assert (caught.value.field, caught.value.problem) == (
        "metrics.devices",
        f"{METRICS_MAX_SAMPLES + 1} samples; at most {METRICS_MAX_SAMPLES} in one message",
    )
    with pytest.raises(ProtocolError) as caught:
        parse({**message, "samples_v": 2})
    assert (caught.value.field, caught.value.problem) == (
        "metrics.samples_v",
        "unsupported samples version 2; this side reads 1",
    )
    with pytest.raises(ProtocolError) as caught:
        parse({**message, "attempts": []})
    assert (caught.value.field, caught.value.problem) == (
        "metrics.devices",
        "a metrics message needs samples (devices or attempts) or a single sample",
    )
    with pytest.raises(ProtocolError) as caught:
        parse({**message, "attempts": [{**one, "sm_util_pct": 100.5}]})
    assert caught.value.field == "metrics.attempts[0].sm_util_pct"


# --- settings --------------------------------------------------------------------------------


def test_the_sampling_and_batch_intervals_are_settings() -> None:
    base = {"PORTAL_AGENT_NODE": "gpu-1", "PORTAL_AGENT_KEY": key_to_text(bytes(range(32)))}
    assert (
        AgentSettings.from_env(base).metrics_s,
        AgentSettings.from_env(base).metrics_batch_s,
    ) == (30.0, 60.0)
    tuned = AgentSettings.from_env(
        {**base, "PORTAL_AGENT_METRICS_S": "5", "PORTAL_AGENT_METRICS_BATCH_S": "20"}
    )
    assert (tuned.metrics_s, tuned.metrics_batch_s) == (5.0, 20.0)
    with pytest.raises(SettingsError) as caught:
        AgentSettings.from_env({**base, "PORTAL_AGENT_METRICS_S": "0"})
    assert str(caught.value) == (
        "PORTAL_AGENT_METRICS_S: must be a positive number of seconds; got '0'"
    )
