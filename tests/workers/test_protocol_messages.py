"""The portal <-> agent message contract: round trips and every validation rule."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from workers.protocol import (
    LOG_CHUNK_MAX_BYTES,
    PROTOCOL_VERSION,
    Device,
    Finished,
    Gpu,
    Heartbeat,
    Inventory,
    JobRef,
    Launch,
    LogChunk,
    Metrics,
    MigDevice,
    ProtocolError,
    Started,
    Stop,
    node_queue,
    parse,
)

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
)

EVERY_MESSAGE = [
    LAUNCH,
    Launch(
        job_id=43,
        attempt=0,
        name="mps",
        team="nlp",
        user="bob",
        image="img",
        command=("run",),
        env={},
        devices=(MPS, MPS.__class__(**{**MPS.to_dict(), "slice_id": "n1/3/mps/2"})),
    ),
    Stop(job_id=42, attempt=1, reason="cancel", grace_s=5.0),
    Heartbeat(
        node="gpu-host-1",
        agent_version="0.1.0",
        sent_at=1700000000.5,
        inventory=INVENTORY,
        running=(JobRef(job_id=42, attempt=1),),
    ),
    Started(node="gpu-host-1", job_id=42, attempt=1, started_at=1700000001.0, pid=1234),
    Started(node="gpu-host-1", job_id=42, attempt=1, started_at=1.0, container_id="abc123"),
    LogChunk(node="gpu-host-1", job_id=42, attempt=1, seq=0, data="héllo\n"),
    Finished(
        node="gpu-host-1",
        job_id=42,
        attempt=1,
        exit_code=None,
        outcome="launch_error",
        finished_at=2.0,
        error="command not found: nope",
    ),
    Metrics(
        node="gpu-host-1",
        job_id=42,
        attempt=1,
        gpu_util_pct=None,
        memory_used_mb=512,
        sampled_at=3.0,
    ),
]


def assert_json_safe(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            assert_json_safe(item)
    elif isinstance(value, list):
        for item in value:
            assert_json_safe(item)
    else:
        assert value is None or isinstance(value, (str, int, float, bool)), repr(value)


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: m.TYPE)
def test_every_message_survives_a_json_round_trip(message: Any) -> None:
    data = message.to_dict()
    assert data["type"] == message.TYPE
    assert data["v"] == PROTOCOL_VERSION
    assert_json_safe(data)
    assert parse(json.loads(json.dumps(data))) == message


def test_launch_dict_has_the_documented_shape() -> None:
    assert LAUNCH.to_dict() == {
        "type": "launch",
        "v": 1,
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
    }


def test_builders_accept_plain_lists_and_dicts() -> None:
    launch = Launch(
        job_id=1,
        attempt=0,
        name="n",
        team="t",
        user="u",
        image="i",
        command=["python", "-V"],
        env={},
        devices=[WHOLE.to_dict()],
    )
    assert launch.command == ("python", "-V")
    assert launch.devices == (WHOLE,)


def test_integers_are_accepted_where_numbers_are_expected() -> None:
    stop = parse(
        {"type": "stop", "v": 1, "job_id": 1, "attempt": 0, "reason": "cancel", "grace_s": 5}
    )
    assert isinstance(stop, Stop)
    assert stop.grace_s == 5.0 and isinstance(stop.grace_s, float)


def test_defaults_fill_optional_fields() -> None:
    stop = parse({"type": "stop", "v": 1, "job_id": 1, "attempt": 0, "reason": "preempt"})
    assert stop == Stop(job_id=1, attempt=0, reason="preempt", grace_s=10.0)


def test_node_queue_is_named_after_the_node() -> None:
    assert node_queue("gpu-host-1") == "node.gpu-host-1"


def launch_with(**changes: Any) -> dict[str, Any]:
    return {**LAUNCH.to_dict(), **changes}


def device_with(**changes: Any) -> dict[str, Any]:
    return launch_with(devices=[{**WHOLE.to_dict(), **changes}])


def heartbeat_gpu_with(**changes: Any) -> dict[str, Any]:
    data = EVERY_MESSAGE[3].to_dict()
    data["inventory"]["gpus"][0].update(changes)
    return data


BAD_MESSAGES = [
    # (received dict, field the error must name, words it must contain)
    ([], "", "must be an object"),
    ({"v": 1}, "type", "must be one of 'launch', 'stop'"),
    (launch_with(type="launched"), "type", "got str 'launched'"),
    (launch_with(v=2), "v", "unsupported protocol version 2"),
    (launch_with(v="1"), "v", "must be an integer"),
    ({k: v for k, v in LAUNCH.to_dict().items() if k != "v"}, "v", "got null"),
    ({k: v for k, v in LAUNCH.to_dict().items() if k != "image"}, "launch.image", "missing"),
    (launch_with(colour="red"), "launch.colour", "unknown field"),
    (launch_with(job_id="42"), "launch.job_id", "must be an integer; got str '42'"),
    (launch_with(job_id=True), "launch.job_id", "got boolean True"),
    (launch_with(job_id=0), "launch.job_id", "positive"),
    (launch_with(attempt=-1), "launch.attempt", "0 or more"),
    (launch_with(attempt=1.5), "launch.attempt", "must be an integer"),
    (launch_with(command="python -V"), "launch.command", "must be a list"),
    (launch_with(command=[]), "launch.command", "at least one"),
    (launch_with(command=["python", 3]), "launch.command[1]", "must be a string"),
    (launch_with(env=[]), "launch.env", "must be an object"),
    (launch_with(env={"A": 1}), "launch.env.A", "must be a string"),
    (launch_with(env={"A=B": "x"}), "launch.env.A=B", "without '='"),
    (launch_with(image=""), "launch.image", "must not be empty"),
    (launch_with(devices=[]), "launch.devices", "at least one"),
    (launch_with(devices=[WHOLE.to_dict(), WHOLE.to_dict()]), "launch.devices", "twice"),
    (launch_with(devices=["GPU-aaaa"]), "launch.devices[0]", "must be an object"),
    (launch_with(time_limit_s="1h"), "launch.time_limit_s", "must be a number or null"),
    (launch_with(time_limit_s=0), "launch.time_limit_s", "positive"),
    (launch_with(time_limit_s=math.inf), "launch.time_limit_s", "finite"),
    (device_with(kind="vgpu"), "launch.devices[0].kind", "'whole', 'mig', 'mps'"),
    (device_with(slice_id=""), "launch.devices[0].slice_id", "must not be empty"),
    (device_with(gpu_index=-1), "launch.devices[0].gpu_index", "0 or more"),
    (device_with(kind="mig"), "launch.devices[0].mig_uuid", "required for kind 'mig'"),
    (
        device_with(kind="mig", mig_uuid="MIG-1"),
        "launch.devices[0].profile",
        "required for kind 'mig'",
    ),
    (device_with(mig_uuid="MIG-1"), "launch.devices[0].mig_uuid", "only allowed for kind 'mig'"),
    (device_with(kind="mps"), "launch.devices[0].mps_fraction", "required for kind 'mps'"),
    (
        device_with(kind="mps", mps_fraction=1.5),
        "launch.devices[0].mps_fraction",
        "> 0 and <= 1",
    ),
    (device_with(mps_fraction=0.5), "launch.devices[0].mps_fraction", "only allowed"),
    (device_with(memory_mb=0), "launch.devices[0].memory_mb", "positive"),
    (device_with(memory_mb="80G"), "launch.devices[0].memory_mb", "an integer or null"),
    (device_with(extra=1), "launch.devices[0].extra", "unknown field"),
    (
        {"type": "stop", "v": 1, "job_id": 1, "attempt": 0, "reason": "kill"},
        "stop.reason",
        "'cancel', 'preempt', 'time_limit'",
    ),
    (
        {"type": "stop", "v": 1, "job_id": 1, "attempt": 0, "reason": "cancel", "grace_s": -1},
        "stop.grace_s",
        "0 or more",
    ),
    (heartbeat_gpu_with(mode="split"), "heartbeat.inventory.gpus[0].mode", "'whole', 'mig'"),
    (heartbeat_gpu_with(uuid="0"), "heartbeat.inventory.gpus[0].uuid", "'GPU-'"),
    (heartbeat_gpu_with(mps_shares=2), "heartbeat.inventory.gpus[0].mps_shares", "must be 0"),
    (
        heartbeat_gpu_with(mig=[{"uuid": "MIG-1", "profile": "1g.10gb"}]),
        "heartbeat.inventory.gpus[0].mig",
        "unless mode is 'mig'",
    ),
    (heartbeat_gpu_with(index=2), "heartbeat.inventory.gpus[1].index", "duplicate"),
    (
        {
            **EVERY_MESSAGE[3].to_dict(),
            "inventory": {"hostname": "h", "driver": "cuda", "gpus": []},
        },
        "heartbeat.inventory.driver",
        "'nvml', 'described'",
    ),
    (
        {**EVERY_MESSAGE[3].to_dict(), "running": [{"job_id": 1}]},
        "heartbeat.running[0].attempt",
        "missing",
    ),
    (
        {**EVERY_MESSAGE[4].to_dict(), "pid": None},
        "started.pid",
        "one of pid or container_id",
    ),
    (
        {**EVERY_MESSAGE[6].to_dict(), "data": "x" * (LOG_CHUNK_MAX_BYTES + 1)},
        "log.data",
        f"at most {LOG_CHUNK_MAX_BYTES}",
    ),
    ({**EVERY_MESSAGE[6].to_dict(), "seq": -1}, "log.seq", "0 or more"),
    (
        {**EVERY_MESSAGE[7].to_dict(), "outcome": "crashed"},
        "finished.outcome",
        "'succeeded', 'failed', 'cancelled', 'timed_out', 'preempted', 'launch_error'",
    ),
    ({**EVERY_MESSAGE[7].to_dict(), "exit_code": "1"}, "finished.exit_code", "integer or null"),
    ({**EVERY_MESSAGE[8].to_dict(), "gpu_util_pct": 101}, "metrics.gpu_util_pct", "0 and 100"),
    ({**EVERY_MESSAGE[8].to_dict(), "sampled_at": math.nan}, "metrics.sampled_at", "finite"),
]


@pytest.mark.parametrize(("data", "field", "words"), BAD_MESSAGES, ids=lambda v: str(v)[:40])
def test_a_bad_message_is_refused_naming_the_field(data: Any, field: str, words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse(data)
    assert caught.value.field == field
    assert words in str(caught.value)
    if field:
        assert str(caught.value).startswith(f"{field}: ")


def test_building_a_bad_message_fails_where_it_is_built() -> None:
    with pytest.raises(ProtocolError, match=r"^stop\.reason: must be one of"):
        Stop(job_id=1, attempt=0, reason="halt", grace_s=1.0)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"^launch\.devices\[0\]\.kind: must be one of"):
        Launch(**{**LAUNCH.__dict__, "devices": [{**WHOLE.to_dict(), "kind": "gpu"}]})


def test_a_log_chunk_of_exactly_the_limit_is_accepted() -> None:
    text = "é" * (LOG_CHUNK_MAX_BYTES // 2)  # two bytes each in UTF-8
    chunk = LogChunk(node="n", job_id=1, attempt=0, seq=0, data=text)
    assert len(chunk.data.encode()) == LOG_CHUNK_MAX_BYTES
