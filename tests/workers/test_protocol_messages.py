"""The portal <-> agent message contract (version 2): round trips and every validation rule."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from workers.protocol import (
    ACK_MAX_REPORTS,
    LAUNCHES_MAX,
    LOG_CHUNK_MAX_BYTES,
    MESSAGE_TYPES,
    NODE_NAME_PATTERN,
    OUTCOMES,
    PROTOCOL_VERSION,
    REPORTS_MAX,
    REPORTS_MAX_LOG_BYTES,
    TO_AGENT_TYPES,
    TO_PORTAL_TYPES,
    Ack,
    AttemptSample,
    ContainerPolicy,
    Device,
    DeviceSample,
    Finished,
    Gpu,
    Heartbeat,
    Inventory,
    Launch,
    Launches,
    LogChunk,
    Message,
    Metrics,
    MigDevice,
    ProtocolError,
    Query,
    ReportKey,
    Reports,
    RunningAttempt,
    Started,
    Stop,
    checked,
    node_queue,
    parse,
    report_batches,
    to_json,
)

NODE = "gpu-host-1"

WHOLE = Device(slice_id="n1/0", kind="whole", gpu_uuid="GPU-aaaa", gpu_index=0, memory_mb=81920)
MIG = Device(
    slice_id="n1/2/mig/0",
    kind="mig",
    gpu_uuid="GPU-cccc",
    gpu_index=2,
    mig_uuid="MIG-1111",
    profile="1g.10gb",
    memory_mb=9856,
)
MPS = Device(
    slice_id="n1/3/mps/1",
    kind="mps",
    gpu_uuid="GPU-dddd",
    gpu_index=3,
    mps_fraction=0.25,
    memory_mb=20480,
)
MPS_SECOND_SHARE = Device(
    slice_id="n1/3/mps/2",
    kind="mps",
    gpu_uuid="GPU-dddd",
    gpu_index=3,
    mps_fraction=0.25,
    memory_mb=20480,
)

INVENTORY = Inventory(
    hostname="gpu-host-1",
    driver="described",
    gpus=(
        Gpu(uuid="GPU-aaaa", index=0, model="NVIDIA A100-SXM4-80GB", memory_mb=81920, mode="whole"),
        Gpu(
            uuid="GPU-cccc",
            index=2,
            model="NVIDIA A100-SXM4-80GB",
            memory_mb=81920,
            mode="mig",
            mig=(MigDevice(uuid="MIG-1111", profile="1g.10gb"),),
        ),
        Gpu(
            uuid="GPU-dddd",
            index=3,
            model="NVIDIA A100-SXM4-80GB",
            memory_mb=81920,
            mode="mps",
            mps_shares=4,
        ),
    ),
)

LAUNCH = Launch(
    node=NODE,
    job_id=42,
    attempt=1,
    name="hello",
    team="vision",
    user="alice",
    image="python:3.11-slim",
    command=("python", "-c", "print('hi')"),
    env={"SEED": "7"},
    devices=(WHOLE,),
    time_limit_s=3600.0,
    policy=ContainerPolicy(
        memory_mb=16384,
        cpus=4.0,
        pids_limit=4096,
        network="jobs-net",
        read_only_rootfs=True,
        image_prefixes=("registry.example.org/vision/", "python:"),
    ),
)
STOP = Stop(node=NODE, job_id=42, attempt=1, reason="cancel", grace_s=5.0)
QUERY = Query(node=NODE, job_id=42, attempt=1)
ACK = Ack(
    node=NODE,
    boot="b-2",
    heartbeat_seq=7,
    lease_s=30.0,
    reports=(
        ReportKey(kind="started", job_id=42, attempt=1),
        ReportKey(kind="log", job_id=42, attempt=1, seq=3),
        ReportKey(kind="finished", job_id=42, attempt=1),
    ),
)
STARTED = Started(node=NODE, job_id=42, attempt=1, started_at=1700000001.0, pid=1234)
LOG = LogChunk(node=NODE, job_id=42, attempt=1, seq=0, data="héllo\n")
FINISHED = Finished(
    node=NODE,
    job_id=42,
    attempt=1,
    exit_code=0,
    outcome="succeeded",
    finished_at=1700000060.0,
    started_at=1700000001.0,
    log_chunks=3,
)
HEARTBEAT = Heartbeat(
    node=NODE,
    boot="b-2",
    previous_boot="b-1",
    seq=7,
    agent_version="0.2.0",
    sent_at=1700000000.5,
    inventory=INVENTORY,
    running=(
        RunningAttempt(job_id=43, attempt=0, started_at=1700000000.0, pid=99),
        RunningAttempt(job_id=44, attempt=2),
    ),
    finished=(FINISHED,),
)
METRICS = Metrics(
    node=NODE,
    job_id=42,
    attempt=1,
    gpu_util_pct=87.5,
    memory_used_mb=512,
    sampled_at=1700000030.0,
)

EVERY_MESSAGE: list[Message] = [
    LAUNCH,
    Launch(
        node=NODE,
        job_id=43,
        attempt=0,
        name="mps",
        team="nlp",
        user="bob",
        image="img",
        command=("run",),
        env={},
        devices=(MPS, MPS_SECOND_SHARE),
    ),
    Launch(
        node=NODE,
        job_id=44,
        attempt=0,
        name="mig",
        team="nlp",
        user="bob",
        image="img",
        command=("run",),
        env={},
        devices=(MIG,),
    ),
    STOP,
    QUERY,
    ACK,
    Ack(node=NODE),
    HEARTBEAT,
    STARTED,
    Started(node=NODE, job_id=42, attempt=1, started_at=1.0, container_id="abc123"),
    LOG,
    FINISHED,
    Finished(
        node=NODE,
        job_id=42,
        attempt=1,
        exit_code=None,
        outcome="launch_error",
        finished_at=2.0,
        error="command not found: nope",
    ),
    METRICS,
    Metrics(node=NODE, job_id=42, attempt=1, gpu_util_pct=None, memory_used_mb=0, sampled_at=3.0),
    # A batch of GPU samples (workers.metrics), null where NVML cannot tell.
    Metrics(
        node=NODE,
        devices=(
            DeviceSample(
                at=4.0,
                uuid="GPU-aaaa",
                sm_util_pct=87.5,
                mem_util_pct=40.0,
                memory_used_mb=30000,
                memory_total_mb=81920,
                processes=2,
                mps_clients=1,
                power_w=312.5,
                temperature_c=61.0,
            ),
            DeviceSample(at=4.0, uuid="MIG-1111", memory_used_mb=9000, processes=0),
            DeviceSample(at=4.0, uuid="GPU-aaaa", error="NVML: GPU is lost"),
        ),
        attempts=(
            AttemptSample(at=4.0, job_id=42, attempt=1, sm_util_pct=87.5, processes=1),
            AttemptSample(at=4.0, job_id=44, attempt=0),
        ),
    ),
    Launches(
        node=NODE,
        launches=(LAUNCH, msgspec.structs.replace(LAUNCH, job_id=45, attempt=0)),
    ),
    Reports(node=NODE, reports=(STARTED, LOG, FINISHED)),
]


def assert_json_safe(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            assert_json_safe(item)
    elif isinstance(value, (list, tuple)):  # to_dict() keeps tuples; JSON writes them as arrays
        for item in value:
            assert_json_safe(item)
    else:
        assert value is None or isinstance(value, (str, int, float, bool)), repr(value)


def message_id(message: Message) -> str:
    return message.TYPE


def as_received(message: Message) -> dict[str, Any]:
    """The message as the other side decodes it from JSON."""
    return json.loads(json.dumps(message.to_dict()))  # type: ignore[no-any-return]


# --- round trips ----------------------------------------------------------------------------


def test_the_examples_cover_every_message_type() -> None:
    assert {m.TYPE for m in EVERY_MESSAGE} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=message_id)
def test_every_message_survives_a_json_round_trip(message: Message) -> None:
    data = message.to_dict()
    assert data["type"] == message.TYPE
    assert data["v"] == PROTOCOL_VERSION
    assert_json_safe(data)
    assert parse(json.loads(json.dumps(data))) == message
    assert parse(json.loads(to_json(message))) == message


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=message_id)
def test_checked_returns_a_valid_message_unchanged(message: Message) -> None:
    assert checked(message) == message


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_every_outcome_survives_a_round_trip(outcome: str) -> None:
    finished = Finished(
        node=NODE,
        job_id=1,
        attempt=0,
        exit_code=None,
        outcome=outcome,  # type: ignore[arg-type]
        finished_at=5.0,
    )
    assert parse(json.loads(to_json(finished))) == finished


def test_the_outcomes_are_the_documented_ten() -> None:
    assert OUTCOMES == (
        "succeeded",
        "failed",
        "cancelled",
        "timed_out",
        "preempted",
        "launch_error",
        "fenced",
        "lost",
        "unknown",
        "superseded",
    )


def test_launch_dict_has_the_documented_shape() -> None:
    assert as_received(LAUNCH) == {
        "type": "launch",
        "v": 2,
        "node": "gpu-host-1",
        "job_id": 42,
        "attempt": 1,
        "name": "hello",
        "team": "vision",
        "user": "alice",
        "image": "python:3.11-slim",
        "command": ["python", "-c", "print('hi')"],
        "env": {"SEED": "7"},
        "devices": [
            {
                "slice_id": "n1/0",
                "kind": "whole",
                "gpu_uuid": "GPU-aaaa",
                "gpu_index": 0,
                "mig_uuid": "",
                "profile": "",
                "mps_fraction": None,
                "memory_mb": 81920,
            }
        ],
        "time_limit_s": 3600.0,
        "policy": {
            "memory_mb": 16384,
            "cpus": 4.0,
            "pids_limit": 4096,
            "network": "jobs-net",
            "read_only_rootfs": True,
            "image_prefixes": ["registry.example.org/vision/", "python:"],
        },
    }


def test_a_launch_without_a_policy_gets_the_safe_defaults() -> None:
    # A version-2 launch from before the field: no network, the host's limits, any image.
    launch = parse(set_at(LAUNCH, "policy", DELETE))
    assert isinstance(launch, Launch)
    assert launch.policy == ContainerPolicy(
        memory_mb=None,
        cpus=None,
        pids_limit=None,
        network="none",
        read_only_rootfs=False,
        image_prefixes=(),
    )


def test_a_heartbeat_carries_its_unacknowledged_finished_reports_as_messages() -> None:
    data = as_received(HEARTBEAT)
    assert data["finished"] == [as_received(FINISHED)]
    assert data["finished"][0]["type"] == "finished"
    assert data["running"][1] == {
        "job_id": 44,
        "attempt": 2,
        "started_at": None,
        "pid": None,
        "container_id": None,
    }


def test_a_finished_report_inside_a_heartbeat_may_omit_its_tag_and_version() -> None:
    data = as_received(HEARTBEAT)
    del data["finished"][0]["type"], data["finished"][0]["v"]
    assert parse(data) == HEARTBEAT


def test_a_heartbeat_of_an_agent_older_than_the_address_field_is_accepted() -> None:
    data = as_received(HEARTBEAT)
    del data["address"]
    heartbeat = parse(data)
    assert isinstance(heartbeat, Heartbeat) and heartbeat.address == ""


@pytest.mark.parametrize("address", ["10.0.0.7", "fd00::7", "gpu-7.example.org"])
def test_a_heartbeat_names_where_its_node_is_reached(address: str) -> None:
    heartbeat = parse({**as_received(HEARTBEAT), "address": address})
    assert isinstance(heartbeat, Heartbeat) and heartbeat.address == address


def test_a_heartbeat_address_that_is_no_host_is_refused_naming_the_field() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse({**as_received(HEARTBEAT), "address": "gpu 7"})
    assert caught.value.field == "heartbeat.address"


def test_integers_are_accepted_where_numbers_are_expected() -> None:
    stop = parse({**STOP.to_dict(), "grace_s": 5})
    assert isinstance(stop, Stop)
    assert stop.grace_s == 5.0 and isinstance(stop.grace_s, float)
    launch = parse(set_at(LAUNCH, "devices.0", {**MPS.to_dict(), "mps_fraction": 1}))
    assert isinstance(launch, Launch)
    assert launch.devices[0].mps_fraction == 1.0


def test_defaults_fill_optional_fields() -> None:
    data = {"type": "stop", "v": 2, "node": NODE, "job_id": 1, "attempt": 0, "reason": "preempt"}
    assert parse(data) == Stop(node=NODE, job_id=1, attempt=0, reason="preempt", grace_s=10.0)
    ack = parse({"type": "ack", "v": 2, "node": NODE})
    assert ack == Ack(node=NODE, boot="", heartbeat_seq=None, lease_s=None, reports=())


def test_node_queue_is_named_after_the_node() -> None:
    assert node_queue("gpu-host-1") == "node.gpu-host-1"


def test_each_message_type_travels_in_one_direction() -> None:
    assert sorted(TO_AGENT_TYPES) == ["ack", "launch", "launches", "query", "stop"]
    assert sorted(TO_PORTAL_TYPES) == [
        "finished",
        "heartbeat",
        "log",
        "metrics",
        "reports",
        "started",
    ]
    assert not TO_AGENT_TYPES & TO_PORTAL_TYPES
    assert set(MESSAGE_TYPES) == TO_AGENT_TYPES | TO_PORTAL_TYPES


def test_a_node_name_of_128_characters_is_accepted() -> None:
    assert parse({**QUERY.to_dict(), "node": "n" * 128}).node == "n" * 128


def test_two_mps_shares_of_one_gpu_are_two_devices() -> None:
    launch = EVERY_MESSAGE[1]
    assert isinstance(launch, Launch)
    assert [d.mps_fraction for d in launch.devices] == [0.25, 0.25]
    assert {d.gpu_uuid for d in launch.devices} == {"GPU-dddd"}


def test_the_inventory_lists_every_gpu_and_mig_uuid() -> None:
    assert INVENTORY.uuids() == {"GPU-aaaa", "GPU-cccc", "MIG-1111", "GPU-dddd"}


# --- report keys ----------------------------------------------------------------------------


def test_each_report_names_its_key() -> None:
    assert STARTED.report_key() == ReportKey(kind="started", job_id=42, attempt=1, seq=0)
    assert LOG.report_key() == ReportKey(kind="log", job_id=42, attempt=1, seq=0)
    assert FINISHED.report_key() == ReportKey(kind="finished", job_id=42, attempt=1, seq=0)
    later = LogChunk(node=NODE, job_id=42, attempt=1, seq=9, data="")
    assert later.report_key().as_tuple() == ("log", 42, 1, 9)


def test_an_ack_names_reports_by_their_keys() -> None:
    assert [key.as_tuple() for key in ACK.reports] == [
        ("started", 42, 1, 0),
        ("log", 42, 1, 3),
        ("finished", 42, 1, 0),
    ]
    assert as_received(ACK)["reports"][1] == {"kind": "log", "job_id": 42, "attempt": 1, "seq": 3}


def test_an_ack_of_exactly_the_limit_is_accepted() -> None:
    keys = [{"kind": "log", "job_id": 1, "attempt": 0, "seq": i} for i in range(ACK_MAX_REPORTS)]
    ack = parse({"type": "ack", "v": 2, "node": NODE, "reports": keys})
    assert isinstance(ack, Ack)
    assert len(ack.reports) == ACK_MAX_REPORTS


# --- what is refused, and how it is named ---------------------------------------------------

DELETE = object()


def set_at(message: Message, path: str, value: Any) -> dict[str, Any]:
    """`message` as a dict with the value at dotted `path` (list indexes as digits) replaced,
    or removed when `value` is DELETE."""
    data: Any = as_received(message)
    root = data
    *parents, last = path.split(".")
    for part in parents:
        data = data[int(part)] if part.isdigit() else data[part]
    if value is DELETE:
        del data[last]
    elif last.isdigit():
        data[int(last)] = value
    else:
        data[last] = value
    return root  # type: ignore[no-any-return]


def device_with(**changes: Any) -> dict[str, Any]:
    return set_at(LAUNCH, "devices", [{**WHOLE.to_dict(), **changes}])


def gpu_with(**changes: Any) -> dict[str, Any]:
    return set_at(HEARTBEAT, "inventory.gpus.0", {**INVENTORY.gpus[0].to_dict(), **changes})


NODE_PROBLEM = f"Expected `str` matching regex '{NODE_NAME_PATTERN}'"
MISSING = "missing required field"

# msgspec names only the refused value; the error lists the values the Literal allows.
SLICE_KINDS = "must be one of 'whole', 'mig', 'mps'"
STOP_REASONS = "must be one of 'cancel', 'preempt', 'time_limit'"
REPORT_KINDS = "must be one of 'started', 'log', 'finished'"
OUTCOME_CHOICES = (
    "must be one of 'succeeded', 'failed', 'cancelled', 'timed_out', 'preempted', "
    "'launch_error', 'fenced', 'lost', 'unknown', 'superseded'"
)
DRIVERS = "must be one of 'nvml', 'described'"

BAD_MESSAGES = [
    # (id, received dict, the field the error names, the problem it states)
    ("not-an-object", [], "", "a message must be an object; got list"),
    (
        "no-type",
        {"v": 2},
        "type",
        "must be one of 'launch', 'launches', 'stop', 'query', 'ack', 'heartbeat', 'started', "
        "'log', 'finished', 'reports', 'metrics'; got None",
    ),
    (
        "unknown-type",
        set_at(LAUNCH, "type", "launched"),
        "type",
        "must be one of 'launch', 'launches', 'stop', 'query', 'ack', 'heartbeat', 'started', "
        "'log', 'finished', 'reports', 'metrics'; got 'launched'",
    ),
    # launch
    ("launch-no-image", set_at(LAUNCH, "image", DELETE), "launch.image", MISSING),
    ("launch-no-node", set_at(LAUNCH, "node", DELETE), "launch.node", MISSING),
    ("launch-bad-node", set_at(LAUNCH, "node", "-gpu"), "launch.node", NODE_PROBLEM),
    ("launch-empty-node", set_at(LAUNCH, "node", ""), "launch.node", NODE_PROBLEM),
    ("launch-long-node", set_at(LAUNCH, "node", "n" * 129), "launch.node", NODE_PROBLEM),
    ("launch-node-space", set_at(LAUNCH, "node", "gpu 1"), "launch.node", NODE_PROBLEM),
    (
        "launch-job-str",
        set_at(LAUNCH, "job_id", "42"),
        "launch.job_id",
        "Expected `int`, got `str`",
    ),
    ("launch-job-0", set_at(LAUNCH, "job_id", 0), "launch.job_id", "Expected `int` >= 1"),
    ("launch-attempt-neg", set_at(LAUNCH, "attempt", -1), "launch.attempt", "Expected `int` >= 0"),
    (
        "launch-attempt-float",
        set_at(LAUNCH, "attempt", 1.5),
        "launch.attempt",
        "Expected `int`, got `float`",
    ),
    (
        "launch-command-str",
        set_at(LAUNCH, "command", "python -V"),
        "launch.command",
        "Expected `array`, got `str`",
    ),
    (
        "launch-command-empty",
        set_at(LAUNCH, "command", []),
        "launch.command",
        "Expected `array` of length >= 1",
    ),
    (
        "launch-command-int",
        set_at(LAUNCH, "command", ["python", 3]),
        "launch.command[1]",
        "Expected `str`, got `int`",
    ),
    ("launch-env-list", set_at(LAUNCH, "env", []), "launch.env", "Expected `object`, got `array`"),
    # msgspec does not name the key of a bad dict value, only the dict.
    (
        "launch-env-int",
        set_at(LAUNCH, "env", {"A": 1}),
        "launch.env[...]",
        "Expected `str`, got `int`",
    ),
    (
        "launch-env-equals",
        set_at(LAUNCH, "env", {"A=B": "x"}),
        "launch.env.A=B",
        "a variable name must be non-empty, without '=' or NUL",
    ),
    (
        "launch-env-nul",
        set_at(LAUNCH, "env", {"A\0": "x"}),
        "launch.env.A\0",
        "a variable name must be non-empty, without '=' or NUL",
    ),
    (
        "launch-env-empty",
        set_at(LAUNCH, "env", {"": "x"}),
        "launch.env.",
        "a variable name must be non-empty, without '=' or NUL",
    ),
    (
        "launch-image-empty",
        set_at(LAUNCH, "image", ""),
        "launch.image",
        "Expected `str` of length >= 1",
    ),
    (
        "launch-time-limit-str",
        set_at(LAUNCH, "time_limit_s", "1h"),
        "launch.time_limit_s",
        "Expected `float | null`, got `str`",
    ),
    (
        "launch-time-limit-0",
        set_at(LAUNCH, "time_limit_s", 0),
        "launch.time_limit_s",
        "Expected `float` > 0.0",
    ),
    (
        "launch-time-limit-huge",
        set_at(LAUNCH, "time_limit_s", 1e10),
        "launch.time_limit_s",
        "Expected `float` <= 1000000000.0",
    ),
    # launch without devices
    (
        "launch-devices-empty",
        set_at(LAUNCH, "devices", []),
        "launch.devices",
        "Expected `array` of length >= 1",
    ),
    ("launch-devices-missing", set_at(LAUNCH, "devices", DELETE), "launch.devices", MISSING),
    (
        "launch-devices-null",
        set_at(LAUNCH, "devices", None),
        "launch.devices",
        "Expected `array`, got `null`",
    ),
    (
        "launch-device-twice",
        set_at(LAUNCH, "devices", [WHOLE.to_dict(), WHOLE.to_dict()]),
        "launch.devices",
        "slice_id listed twice",
    ),
    (
        "launch-device-str",
        set_at(LAUNCH, "devices", ["GPU-aaaa"]),
        "launch.devices[0]",
        "Expected `object`, got `str`",
    ),
    # devices: MIG and MPS rules
    (
        "device-kind",
        device_with(kind="vgpu"),
        "launch.devices[0].kind",
        f"{SLICE_KINDS}; got 'vgpu'",
    ),
    (
        "device-slice-empty",
        device_with(slice_id=""),
        "launch.devices[0].slice_id",
        "Expected `str` of length >= 1",
    ),
    (
        "device-gpu-uuid-empty",
        device_with(gpu_uuid=""),
        "launch.devices[0].gpu_uuid",
        "Expected `str` of length >= 1",
    ),
    (
        "device-index-neg",
        device_with(gpu_index=-1),
        "launch.devices[0].gpu_index",
        "Expected `int` >= 0",
    ),
    (
        "mig-without-uuid",
        device_with(kind="mig", profile="1g.10gb"),
        "launch.devices[0].mig_uuid",
        "is required for kind 'mig'",
    ),
    (
        "mig-without-profile",
        device_with(kind="mig", mig_uuid="MIG-1"),
        "launch.devices[0].profile",
        "is required for kind 'mig'",
    ),
    (
        "mig-with-fraction",
        set_at(LAUNCH, "devices", [{**MIG.to_dict(), "mps_fraction": 0.5}]),
        "launch.devices[0].mps_fraction",
        "is only allowed for kind 'mps'",
    ),
    (
        "whole-with-mig-uuid",
        device_with(mig_uuid="MIG-1"),
        "launch.devices[0].mig_uuid",
        "is only allowed for kind 'mig'",
    ),
    (
        "whole-with-profile",
        device_with(profile="1g.10gb"),
        "launch.devices[0].profile",
        "is only allowed for kind 'mig'",
    ),
    (
        "whole-with-fraction",
        device_with(mps_fraction=0.5),
        "launch.devices[0].mps_fraction",
        "is only allowed for kind 'mps'",
    ),
    (
        "mps-without-fraction",
        device_with(kind="mps"),
        "launch.devices[0].mps_fraction",
        "is required for kind 'mps'",
    ),
    (
        "mps-with-mig-uuid",
        set_at(LAUNCH, "devices", [{**MPS.to_dict(), "mig_uuid": "MIG-1"}]),
        "launch.devices[0].mig_uuid",
        "is only allowed for kind 'mig'",
    ),
    (
        "mps-fraction-over-1",
        device_with(kind="mps", mps_fraction=1.5),
        "launch.devices[0].mps_fraction",
        "Expected `float` <= 1.0",
    ),
    (
        "mps-fraction-0",
        device_with(kind="mps", mps_fraction=0),
        "launch.devices[0].mps_fraction",
        "Expected `float` > 0.0",
    ),
    (
        "device-memory-0",
        device_with(memory_mb=0),
        "launch.devices[0].memory_mb",
        "Expected `int` >= 1",
    ),
    (
        "device-memory-str",
        device_with(memory_mb="80G"),
        "launch.devices[0].memory_mb",
        "Expected `int | null`, got `str`",
    ),
    (
        "second-device-bad",
        set_at(LAUNCH, "devices", [WHOLE.to_dict(), {**MIG.to_dict(), "profile": ""}]),
        "launch.devices[1].profile",
        "is required for kind 'mig'",
    ),
    # stop
    ("stop-reason", set_at(STOP, "reason", "kill"), "stop.reason", f"{STOP_REASONS}; got 'kill'"),
    ("stop-grace-neg", set_at(STOP, "grace_s", -1), "stop.grace_s", "Expected `float` >= 0.0"),
    ("stop-no-node", set_at(STOP, "node", DELETE), "stop.node", MISSING),
    # query
    ("query-job-0", set_at(QUERY, "job_id", 0), "query.job_id", "Expected `int` >= 1"),
    ("query-no-attempt", set_at(QUERY, "attempt", DELETE), "query.attempt", MISSING),
    # ack
    ("ack-lease-0", set_at(ACK, "lease_s", 0), "ack.lease_s", "Expected `float` > 0.0"),
    (
        "ack-lease-huge",
        set_at(ACK, "lease_s", 2e6),
        "ack.lease_s",
        "Expected `float` <= 1000000.0",
    ),
    ("ack-seq-neg", set_at(ACK, "heartbeat_seq", -1), "ack.heartbeat_seq", "Expected `int` >= 0"),
    (
        "ack-report-kind",
        set_at(ACK, "reports.0.kind", "metrics"),
        "ack.reports[0].kind",
        f"{REPORT_KINDS}; got 'metrics'",
    ),
    (
        "ack-report-seq",
        set_at(ACK, "reports.1.seq", -1),
        "ack.reports[1].seq",
        "Expected `int` >= 0",
    ),
    (
        "ack-report-no-job",
        set_at(ACK, "reports.2.job_id", DELETE),
        "ack.reports[2].job_id",
        MISSING,
    ),
    (
        "ack-too-many",
        set_at(
            ACK,
            "reports",
            [
                {"kind": "log", "job_id": 1, "attempt": 0, "seq": i}
                for i in range(ACK_MAX_REPORTS + 1)
            ],
        ),
        "ack.reports",
        f"Expected `array` of length <= {ACK_MAX_REPORTS}",
    ),
    # heartbeat
    (
        "heartbeat-boot-empty",
        set_at(HEARTBEAT, "boot", ""),
        "heartbeat.boot",
        "Expected `str` of length >= 1",
    ),
    ("heartbeat-no-boot", set_at(HEARTBEAT, "boot", DELETE), "heartbeat.boot", MISSING),
    ("heartbeat-seq-neg", set_at(HEARTBEAT, "seq", -1), "heartbeat.seq", "Expected `int` >= 0"),
    (
        "heartbeat-sent-neg",
        set_at(HEARTBEAT, "sent_at", -1),
        "heartbeat.sent_at",
        "Expected `float` >= 0.0",
    ),
    (
        "heartbeat-running-no-attempt",
        set_at(HEARTBEAT, "running", [{"job_id": 1}]),
        "heartbeat.running[0].attempt",
        MISSING,
    ),
    (
        "heartbeat-running-job-0",
        set_at(HEARTBEAT, "running.1.job_id", 0),
        "heartbeat.running[1].job_id",
        "Expected `int` >= 1",
    ),
    (
        "heartbeat-finished-other-node",
        set_at(
            HEARTBEAT,
            "finished",
            [FINISHED.to_dict(), {**FINISHED.to_dict(), "node": "gpu-host-2"}],
        ),
        "heartbeat.finished[1].node",
        "must be the heartbeat's node",
    ),
    (
        "heartbeat-finished-outcome",
        set_at(HEARTBEAT, "finished.0.outcome", "crashed"),
        "heartbeat.finished[0].outcome",
        f"{OUTCOME_CHOICES}; got 'crashed'",
    ),
    (
        "heartbeat-finished-wrong-tag",
        set_at(HEARTBEAT, "finished.0.type", "started"),
        "heartbeat.finished[0].type",
        "Invalid value 'started'",
    ),
    (
        "heartbeat-finished-v1",
        set_at(HEARTBEAT, "finished.0.v", 1),
        "heartbeat.finished[0].v",
        "unsupported protocol version 1; this side speaks 2",
    ),
    (
        "inventory-driver",
        set_at(HEARTBEAT, "inventory.driver", "cuda"),
        "heartbeat.inventory.driver",
        f"{DRIVERS}; got 'cuda'",
    ),
    (
        "inventory-hostname",
        set_at(HEARTBEAT, "inventory.hostname", ""),
        "heartbeat.inventory.hostname",
        "Expected `str` of length >= 1",
    ),
    (
        "gpu-mode",
        gpu_with(mode="split"),
        "heartbeat.inventory.gpus[0].mode",
        f"{SLICE_KINDS}; got 'split'",
    ),
    (
        "gpu-uuid",
        gpu_with(uuid="0"),
        "heartbeat.inventory.gpus[0].uuid",
        "Expected `str` matching regex '^GPU-'",
    ),
    (
        "gpu-memory-0",
        gpu_with(memory_mb=0),
        "heartbeat.inventory.gpus[0].memory_mb",
        "Expected `int` >= 1",
    ),
    (
        "gpu-whole-with-shares",
        gpu_with(mps_shares=2),
        "heartbeat.inventory.gpus[0].mps_shares",
        "must be 0 unless mode is 'mps'",
    ),
    (
        "gpu-mps-without-shares",
        gpu_with(mode="mps"),
        "heartbeat.inventory.gpus[0].mps_shares",
        "must be 1 or more for mode 'mps'",
    ),
    (
        "gpu-whole-with-mig",
        gpu_with(mig=[{"uuid": "MIG-9", "profile": "1g.10gb"}]),
        "heartbeat.inventory.gpus[0].mig",
        "must be empty unless mode is 'mig'",
    ),
    (
        "gpu-mig-uuid",
        set_at(HEARTBEAT, "inventory.gpus.1.mig.0.uuid", "GPU-x"),
        "heartbeat.inventory.gpus[1].mig[0].uuid",
        "Expected `str` matching regex '^MIG-'",
    ),
    (
        "gpu-mig-profile",
        set_at(HEARTBEAT, "inventory.gpus.1.mig.0.profile", ""),
        "heartbeat.inventory.gpus[1].mig[0].profile",
        "Expected `str` of length >= 1",
    ),
    ("gpu-index-twice", gpu_with(index=2), "heartbeat.inventory.gpus[1].index", "duplicate 2"),
    (
        "gpu-uuid-twice",
        gpu_with(uuid="GPU-cccc"),
        "heartbeat.inventory.gpus[1]",
        "duplicate uuid GPU-cccc",
    ),
    (
        "mig-uuid-twice",
        set_at(HEARTBEAT, "inventory.gpus.1.mig", [{"uuid": "MIG-1", "profile": "1g.10gb"}] * 2),
        "heartbeat.inventory.gpus[1]",
        "duplicate uuid MIG-1",
    ),
    # reports
    (
        "started-no-pid-or-container",
        set_at(STARTED, "pid", None),
        "started.pid",
        "one of pid or container_id is required",
    ),
    (
        "started-empty-container",
        {**STARTED.to_dict(), "pid": None, "container_id": ""},
        "started.pid",
        "one of pid or container_id is required",
    ),
    (
        "log-too-big",
        set_at(LOG, "data", "x" * (LOG_CHUNK_MAX_BYTES + 1)),
        "log.data",
        f"chunk is {LOG_CHUNK_MAX_BYTES + 1} bytes; at most {LOG_CHUNK_MAX_BYTES} allowed",
    ),
    (
        "log-too-big-in-utf8",
        set_at(LOG, "data", "é" * (LOG_CHUNK_MAX_BYTES // 2 + 1)),
        "log.data",
        f"chunk is {LOG_CHUNK_MAX_BYTES + 2} bytes; at most {LOG_CHUNK_MAX_BYTES} allowed",
    ),
    ("log-seq-neg", set_at(LOG, "seq", -1), "log.seq", "Expected `int` >= 0"),
    (
        "finished-outcome",
        set_at(FINISHED, "outcome", "crashed"),
        "finished.outcome",
        f"{OUTCOME_CHOICES}; got 'crashed'",
    ),
    (
        "finished-exit-str",
        set_at(FINISHED, "exit_code", "1"),
        "finished.exit_code",
        "Expected `int | null`, got `str`",
    ),
    ("finished-no-exit", set_at(FINISHED, "exit_code", DELETE), "finished.exit_code", MISSING),
    (
        "finished-log-chunks-neg",
        set_at(FINISHED, "log_chunks", -1),
        "finished.log_chunks",
        "Expected `int` >= 0",
    ),
    (
        "metrics-util-over-100",
        set_at(METRICS, "gpu_util_pct", 101),
        "metrics.gpu_util_pct",
        "Expected `float` <= 100.0",
    ),
    (
        "metrics-half-a-sample",
        set_at(METRICS, "sampled_at", DELETE),
        "metrics.sampled_at",
        "a single sample needs job_id, attempt, memory_used_mb and sampled_at together",
    ),
    (
        "metrics-memory-neg",
        set_at(METRICS, "memory_used_mb", -1),
        "metrics.memory_used_mb",
        "Expected `int` >= 0",
    ),
    (
        "policy-host-network",
        set_at(LAUNCH, "policy.network", "host"),
        "launch.policy.network",
        "'host' is never allowed for a job; use 'none' or a network made for jobs",
    ),
    (
        "policy-container-network",
        set_at(LAUNCH, "policy.network", "container:db"),
        "launch.policy.network",
        "Expected `str` matching regex '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'",
    ),
    (
        "policy-memory-zero",
        set_at(LAUNCH, "policy.memory_mb", 0),
        "launch.policy.memory_mb",
        "Expected `int` >= 1",
    ),
    (
        "policy-cpus-too-few",
        set_at(LAUNCH, "policy.cpus", 0.001),
        "launch.policy.cpus",
        "Expected `float` >= 0.01",
    ),
    (
        "policy-empty-prefix",
        set_at(LAUNCH, "policy.image_prefixes", [""]),
        "launch.policy.image_prefixes[0]",
        "Expected `str` of length >= 1",
    ),
]


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [pytest.param(data, field, problem, id=name) for name, data, field, problem in BAD_MESSAGES],
)
def test_a_bad_message_is_refused_naming_the_field(data: Any, field: str, problem: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(data)
    assert (caught.value.field, caught.value.problem) == (field, problem)
    assert str(caught.value) == (f"{field}: {problem}" if field else problem)


# --- versions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        pytest.param(1, "unsupported protocol version 1; this side speaks 2", id="older"),
        pytest.param(3, "unsupported protocol version 3; this side speaks 2", id="newer"),
        pytest.param(DELETE, "must be an integer protocol version; got None", id="missing"),
        pytest.param("2", "must be an integer protocol version; got '2'", id="string"),
        pytest.param(True, "must be an integer protocol version; got True", id="boolean"),
        pytest.param(2.0, "must be an integer protocol version; got 2.0", id="float"),
    ],
)
def test_only_this_protocol_version_is_accepted(version: Any, problem: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(set_at(QUERY, "v", version))
    assert (caught.value.field, caught.value.problem) == ("v", problem)


def test_building_a_message_of_another_version_fails() -> None:
    with pytest.raises(ProtocolError) as caught:
        Query(node=NODE, job_id=1, attempt=0, v=1)
    assert (caught.value.field, caught.value.problem) == (
        "v",
        "unsupported protocol version 1; this side speaks 2",
    )


# --- unknown fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("colour", "launch.colour"),
        ("devices.0.extra", "launch.devices[0].extra"),
        ("policy.privileged", "launch.policy.privileged"),
    ],
)
def test_an_unknown_field_of_a_launch_is_refused(path: str, field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(set_at(LAUNCH, path, 1))
    assert (caught.value.field, caught.value.problem) == (field, "unknown field")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("colour", "heartbeat.colour"),
        ("inventory.colour", "heartbeat.inventory.colour"),
        ("inventory.gpus.1.colour", "heartbeat.inventory.gpus[1].colour"),
        ("inventory.gpus.1.mig.0.colour", "heartbeat.inventory.gpus[1].mig[0].colour"),
        ("running.0.colour", "heartbeat.running[0].colour"),
        ("finished.0.colour", "heartbeat.finished[0].colour"),
    ],
)
def test_an_unknown_field_of_a_heartbeat_is_refused(path: str, field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(set_at(HEARTBEAT, path, 1))
    assert (caught.value.field, caught.value.problem) == (field, "unknown field")


def test_an_unknown_field_of_an_ack_report_is_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(set_at(ACK, "reports.0.colour", 1))
    assert (caught.value.field, caught.value.problem) == ("ack.reports[0].colour", "unknown field")


# --- booleans are not numbers ---------------------------------------------------------------

BOOLEAN_FOR_NUMBER = [
    (LAUNCH, "job_id", "launch.job_id", "int"),
    (LAUNCH, "attempt", "launch.attempt", "int"),
    (LAUNCH, "devices.0.gpu_index", "launch.devices[0].gpu_index", "int"),
    (LAUNCH, "devices.0.memory_mb", "launch.devices[0].memory_mb", "int | null"),
    (LAUNCH, "time_limit_s", "launch.time_limit_s", "float | null"),
    (STOP, "grace_s", "stop.grace_s", "float"),
    (ACK, "heartbeat_seq", "ack.heartbeat_seq", "int | null"),
    (ACK, "reports.1.seq", "ack.reports[1].seq", "int"),
    (HEARTBEAT, "seq", "heartbeat.seq", "int"),
    (HEARTBEAT, "sent_at", "heartbeat.sent_at", "float"),
    (HEARTBEAT, "inventory.gpus.0.index", "heartbeat.inventory.gpus[0].index", "int"),
    (HEARTBEAT, "inventory.gpus.2.mps_shares", "heartbeat.inventory.gpus[2].mps_shares", "int"),
    (HEARTBEAT, "running.0.pid", "heartbeat.running[0].pid", "int | null"),
    (STARTED, "pid", "started.pid", "int | null"),
    (LOG, "seq", "log.seq", "int"),
    (FINISHED, "exit_code", "finished.exit_code", "int | null"),
    (FINISHED, "log_chunks", "finished.log_chunks", "int"),
    (METRICS, "memory_used_mb", "metrics.memory_used_mb", "int | null"),
]


@pytest.mark.parametrize(
    ("message", "path", "field", "expected"),
    BOOLEAN_FOR_NUMBER,
    ids=[field for _, _, field, _ in BOOLEAN_FOR_NUMBER],
)
def test_a_boolean_is_refused_where_a_number_is_expected(
    message: Message, path: str, field: str, expected: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(set_at(message, path, True))
    assert (caught.value.field, caught.value.problem) == (
        field,
        f"Expected `{expected}`, got `bool`",
    )


# --- NaN and infinities ---------------------------------------------------------------------

# (message, path, field, what a NaN is told, what an infinity is told)
FLOAT_FIELDS = [
    (LAUNCH, "time_limit_s", "launch.time_limit_s", "> 0.0", "<= 1000000000.0"),
    (LAUNCH, "devices.0", "launch.devices[0].mps_fraction", "> 0.0", "<= 1.0"),
    (STOP, "grace_s", "stop.grace_s", ">= 0.0", "<= 1000000000.0"),
    (ACK, "lease_s", "ack.lease_s", "> 0.0", "<= 1000000.0"),
    (HEARTBEAT, "sent_at", "heartbeat.sent_at", ">= 0.0", "<= 100000000000.0"),
    (
        HEARTBEAT,
        "running.0.started_at",
        "heartbeat.running[0].started_at",
        ">= 0.0",
        "<= 100000000000.0",
    ),
    (
        HEARTBEAT,
        "finished.0.finished_at",
        "heartbeat.finished[0].finished_at",
        ">= 0.0",
        "<= 100000000000.0",
    ),
    (STARTED, "started_at", "started.started_at", ">= 0.0", "<= 100000000000.0"),
    (FINISHED, "finished_at", "finished.finished_at", ">= 0.0", "<= 100000000000.0"),
    (FINISHED, "started_at", "finished.started_at", ">= 0.0", "<= 100000000000.0"),
    (METRICS, "gpu_util_pct", "metrics.gpu_util_pct", ">= 0.0", "<= 100.0"),
    (METRICS, "sampled_at", "metrics.sampled_at", ">= 0.0", "<= 100000000000.0"),
]


def with_float(message: Message, path: str, value: float) -> dict[str, Any]:
    if path == "devices.0":  # an MPS share, the only device with a fraction
        return set_at(message, path, {**MPS.to_dict(), "mps_fraction": value})
    return set_at(message, path, value)


@pytest.mark.parametrize(
    ("message", "path", "field", "nan_problem", "inf_problem"),
    FLOAT_FIELDS,
    ids=[field for _, _, field, _, _ in FLOAT_FIELDS],
)
def test_nan_and_infinities_are_refused(
    message: Message, path: str, field: str, nan_problem: str, inf_problem: str
) -> None:
    for value, problem in (
        (math.nan, nan_problem),
        (math.inf, inf_problem),
        (-math.inf, nan_problem),
    ):
        # Through JSON as Python writes it (NaN, Infinity), the way a careless sender would.
        data = json.loads(json.dumps(with_float(message, path, value)))
        with pytest.raises(ProtocolError) as caught:
            parse(data)
        assert (caught.value.field, caught.value.problem) == (field, f"Expected `float` {problem}")


# --- messages built in code -----------------------------------------------------------------


def test_a_bad_cross_field_rule_fails_where_the_message_is_built() -> None:
    with pytest.raises(ProtocolError) as caught:
        Device(slice_id="s", kind="mig", gpu_uuid="GPU-a", gpu_index=0, profile="1g.10gb")
    assert (caught.value.field, caught.value.problem) == ("mig_uuid", "is required for kind 'mig'")
    with pytest.raises(ProtocolError) as caught:
        Heartbeat(
            node=NODE,
            boot="b",
            agent_version="1",
            sent_at=1.0,
            inventory=INVENTORY,
            finished=(FINISHED, msgspec.structs.replace(FINISHED, node="gpu-host-2")),
        )
    assert (caught.value.field, caught.value.problem) == (
        "finished[1].node",
        "must be the heartbeat's node",
    )


BUILT_BAD = [
    # (id, a message built in code that msgspec's constructor lets through, field, problem)
    (
        "stop-reason",
        lambda: Stop(node=NODE, job_id=1, attempt=0, reason="halt"),  # type: ignore[arg-type]
        "stop.reason",
        f"{STOP_REASONS}; got 'halt'",
    ),
    (
        "stop-job-bool",
        lambda: Stop(node=NODE, job_id=True, attempt=0, reason="cancel"),
        "stop.job_id",
        "Expected `int`, got `bool`",
    ),
    (
        "stop-grace-nan",
        lambda: Stop(node=NODE, job_id=1, attempt=0, reason="cancel", grace_s=math.nan),
        "stop.grace_s",
        "Expected `float` >= 0.0",
    ),
    (
        "query-node",
        lambda: Query(node="gpu host", job_id=1, attempt=0),
        "query.node",
        NODE_PROBLEM,
    ),
    (
        "launch-without-devices",
        lambda: msgspec.structs.replace(LAUNCH, devices=()),
        "launch.devices",
        "Expected `array` of length >= 1",
    ),
    (
        "launch-device-kind",
        lambda: msgspec.structs.replace(
            LAUNCH,
            devices=(Device(slice_id="s", kind="vgpu", gpu_uuid="GPU-a", gpu_index=0),),  # type: ignore[arg-type]
        ),
        "launch.devices[0].kind",
        f"{SLICE_KINDS}; got 'vgpu'",
    ),
    (
        "heartbeat-gpu-index",
        lambda: Heartbeat(
            node=NODE,
            boot="b",
            agent_version="1",
            sent_at=1.0,
            inventory=Inventory(
                hostname="h",
                driver="nvml",
                gpus=(Gpu(uuid="GPU-a", index=-1, model="m", memory_mb=1, mode="whole"),),
            ),
        ),
        "heartbeat.inventory.gpus[0].index",
        "Expected `int` >= 0",
    ),
    (
        "ack-report-attempt",
        lambda: Ack(node=NODE, reports=(ReportKey(kind="started", job_id=1, attempt=-1),)),
        "ack.reports[0].attempt",
        "Expected `int` >= 0",
    ),
    (
        "log-seq-str",
        lambda: LogChunk(node=NODE, job_id=1, attempt=0, seq="0", data=""),  # type: ignore[arg-type]
        "log.seq",
        "Expected `int`, got `str`",
    ),
]


@pytest.mark.parametrize(
    ("build", "field", "problem"),
    [pytest.param(build, field, problem, id=name) for name, build, field, problem in BUILT_BAD],
)
def test_checked_catches_a_bad_message_built_in_code(build: Any, field: str, problem: str) -> None:
    # The constructor checks cross-field rules only; types and bounds wait for checked().
    message = build()
    with pytest.raises(ProtocolError) as caught:
        checked(message)
    assert (caught.value.field, caught.value.problem) == (field, problem)
    with pytest.raises(ProtocolError):
        to_json(message)


def test_to_json_never_writes_nan_as_null() -> None:
    started = Started(node=NODE, job_id=1, attempt=0, started_at=math.nan, pid=1)
    assert msgspec.json.encode(started).count(b"null") > 0  # what msgspec alone would send
    with pytest.raises(ProtocolError) as caught:
        to_json(started)
    assert caught.value.field == "started.started_at"


def test_a_log_chunk_of_exactly_the_limit_is_accepted() -> None:
    text = "é" * (LOG_CHUNK_MAX_BYTES // 2)  # two bytes each in UTF-8
    chunk = checked(LogChunk(node=NODE, job_id=1, attempt=0, seq=0, data=text))
    assert isinstance(chunk, LogChunk)
    assert len(chunk.data.encode()) == LOG_CHUNK_MAX_BYTES


# --- batches: `launches` and `reports` ----------------------------------------------------------

LAUNCHES = Launches(node=NODE, launches=(LAUNCH,))
REPORTS = Reports(node=NODE, reports=(STARTED, LOG, FINISHED))


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        pytest.param(
            set_at(LAUNCHES, "launches", []),
            "launches.launches",
            "Expected `array` of length >= 1",
            id="launches-empty",
        ),
        pytest.param(
            set_at(LAUNCHES, "launches", [LAUNCH.to_dict()] * (LAUNCHES_MAX + 1)),
            "launches.launches",
            f"Expected `array` of length <= {LAUNCHES_MAX}",
            id="launches-too-many",
        ),
        pytest.param(
            set_at(LAUNCHES, "launches", [{**LAUNCH.to_dict(), "node": "other-host"}]),
            "launches.launches[0].node",
            "must be the message's node",
            id="launches-another-node",
        ),
        pytest.param(
            set_at(LAUNCHES, "launches", [LAUNCH.to_dict(), LAUNCH.to_dict()]),
            "launches.launches[1]",
            "job 42 attempt 1 twice",
            id="launches-twice",
        ),
        pytest.param(
            set_at(LAUNCHES, "launches", [{**LAUNCH.to_dict(), "image": ""}]),
            "launches.launches[0].image",
            "Expected `str` of length >= 1",
            id="launches-bad-launch",
        ),
        pytest.param(
            set_at(LAUNCHES, "launches", [STOP.to_dict()]),
            "launches.launches[0].type",
            "Invalid value 'stop'",
            id="launches-a-stop",
        ),
        pytest.param(
            set_at(REPORTS, "reports", []),
            "reports.reports",
            "Expected `array` of length >= 1",
            id="reports-empty",
        ),
        pytest.param(
            set_at(REPORTS, "reports", [STARTED.to_dict()] * (REPORTS_MAX + 1)),
            "reports.reports",
            f"Expected `array` of length <= {REPORTS_MAX}",
            id="reports-too-many",
        ),
        pytest.param(
            set_at(REPORTS, "reports", [{**STARTED.to_dict(), "node": "other-host"}]),
            "reports.reports[0].node",
            "must be the message's node",
            id="reports-another-node",
        ),
        pytest.param(
            set_at(REPORTS, "reports", [HEARTBEAT.to_dict()]),
            "reports.reports[0].type",
            "Invalid value 'heartbeat'",
            id="reports-a-heartbeat",
        ),
        pytest.param(
            set_at(REPORTS, "reports", [{**STARTED.to_dict(), "v": 1}]),
            "reports.reports[0].v",
            "unsupported protocol version 1; this side speaks 2",
            id="reports-old-version-inside",
        ),
    ],
)
def test_a_bad_batch_names_the_field(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(data)
    assert (caught.value.field, caught.value.problem) == (field, problem)


def test_a_reports_batch_holds_at_most_its_log_bound() -> None:
    chunk = "x" * LOG_CHUNK_MAX_BYTES
    count = REPORTS_MAX_LOG_BYTES // LOG_CHUNK_MAX_BYTES + 1
    logs = [LogChunk(node=NODE, job_id=42, attempt=1, seq=i, data=chunk) for i in range(count)]
    data = set_at(REPORTS, "reports", [log.to_dict() for log in logs])
    with pytest.raises(ProtocolError) as caught:
        parse(data)
    assert caught.value.field == "reports.reports"
    assert caught.value.problem == (
        f"{count * LOG_CHUNK_MAX_BYTES} bytes of log; at most {REPORTS_MAX_LOG_BYTES} in one message"
    )


def test_report_batches_keep_the_order_within_both_bounds() -> None:
    chunk = "x" * LOG_CHUNK_MAX_BYTES
    per_batch = REPORTS_MAX_LOG_BYTES // LOG_CHUNK_MAX_BYTES
    logs = [
        LogChunk(node=NODE, job_id=42, attempt=1, seq=i, data=chunk) for i in range(per_batch + 1)
    ]
    starts = [
        Started(node=NODE, job_id=j, attempt=0, started_at=1.0, pid=1)
        for j in range(1, REPORTS_MAX + 2)
    ]
    batches = report_batches(NODE, [*logs, *starts])
    assert [len(b.reports) for b in batches] == [per_batch, 1 + REPORTS_MAX - 1, 2]
    assert [r for b in batches for r in b.reports] == [*logs, *starts]
    for batch in batches:
        assert parse(as_received(batch)) == batch
    assert report_batches(NODE, []) == []


def test_a_heartbeat_without_launch_batches_says_the_agent_takes_single_launches() -> None:
    data = HEARTBEAT.to_dict()
    del data["launch_batches"]
    heartbeat = parse(data)
    assert isinstance(heartbeat, Heartbeat) and heartbeat.launch_batches is False
