"""Inventory: described (default, custom, bad input) and read through a fake NVML."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeMig, FakeNvml

from workers.inventory import (
    DEFAULT_MEMORY_MB,
    DEFAULT_MODEL,
    InventoryError,
    described_inventory,
    discover,
    load_description,
    stable_uuid,
)

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# --- described -------------------------------------------------------------------------------


def test_the_default_node_has_two_whole_one_mig_and_one_mps_gpu() -> None:
    inventory = discover("node-a", source="described")
    assert inventory.driver == "described"
    assert inventory.hostname == "node-a"
    assert [(g.index, g.mode) for g in inventory.gpus] == [
        (0, "whole"),
        (1, "whole"),
        (2, "mig"),
        (3, "mps"),
    ]
    assert {g.model for g in inventory.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert {g.memory_mb for g in inventory.gpus} == {81920}
    assert [m.profile for m in inventory.gpus[2].mig] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    assert inventory.gpus[3].mps_shares == 4
    assert all(GPU_UUID.match(g.uuid) for g in inventory.gpus)
    assert all(MIG_UUID.match(m.uuid) for m in inventory.gpus[2].mig)


def test_described_ids_are_stable_per_node_and_differ_between_nodes() -> None:
    first = discover("node-a", source="described")
    again = discover("node-a", source="described")
    other = discover("node-b", source="described")
    assert first == again
    ids = {g.uuid for g in first.gpus} | {m.uuid for g in first.gpus for m in g.mig}
    other_ids = {g.uuid for g in other.gpus} | {m.uuid for g in other.gpus for m in g.mig}
    assert len(ids) == 8
    assert not ids & other_ids
    assert first.gpus[0].uuid == stable_uuid("GPU", "node-a", 0)


def test_a_custom_description_inline_sets_models_modes_and_counts() -> None:
    description = json.dumps(
        {
            "hostname": "h100-box",
            "gpus": [
                {"model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559, "count": 3},
                {
                    "model": "NVIDIA H100 80GB HBM3",
                    "memory_mb": 81559,
                    "mode": "mps",
                    "mps_shares": 2,
                },
                {"mode": "mig", "mig": ["7g.80gb"]},
            ],
        }
    )
    inventory = discover("node-c", source="described", description=description)
    assert inventory.hostname == "h100-box"
    assert [(g.index, g.model, g.mode) for g in inventory.gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "whole"),
        (1, "NVIDIA H100 80GB HBM3", "whole"),
        (2, "NVIDIA H100 80GB HBM3", "whole"),
        (3, "NVIDIA H100 80GB HBM3", "mps"),
        (4, DEFAULT_MODEL, "mig"),
    ]
    assert inventory.gpus[3].mps_shares == 2
    assert inventory.gpus[4].memory_mb == DEFAULT_MEMORY_MB


def test_a_description_can_come_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"gpus": [{"mode": "whole"}]}))
    inventory = discover("node-d", source="described", description=str(path))
    assert [g.mode for g in inventory.gpus] == ["whole"]


def test_unset_or_blank_means_the_default_description() -> None:
    assert load_description(None) == load_description("  ")
    assert len(described_inventory("n", load_description(None)).gpus) == 4


BAD_DESCRIPTIONS = [
    ("{not json", "not valid JSON"),
    ("/nonexistent/inventory.json", "cannot read inventory file /nonexistent/inventory.json"),
    ("[1, 2]", "cannot read inventory file"),  # not an object and not a path either
    ('{"gpus": []}', "gpus: must be a non-empty list"),
    ('{"gpus": [{"mode": "whole"}], "racks": 2}', "racks: unknown field (allowed: hostname, gpus)"),
    ('{"hostname": "", "gpus": [{}]}', "hostname: must be a non-empty string"),
    ('{"gpus": ["whole"]}', "gpus[0]: must be an object"),
    (
        '{"gpus": [{"mode": "vgpu"}]}',
        "gpus[0].mode: must be one of 'whole', 'mig', 'mps'; got 'vgpu'",
    ),
    ('{"gpus": [{"mode": "whole", "colour": 1}]}', "gpus[0].colour: unknown field (allowed: model"),
    ('{"gpus": [{"memory_mb": "80GB"}]}', "gpus[0].memory_mb: must be int; got '80GB'"),
    ('{"gpus": [{"memory_mb": -5}]}', "gpus[0].memory_mb: must be positive"),
    ('{"gpus": [{"model": ""}]}', "gpus[0].model: must be a non-empty string; got ''"),
    ('{"gpus": [{"count": 0}]}', "gpus[0].count: must be 1 or more"),
    ('{"gpus": [{"count": true}]}', "gpus[0].count: must be int; got True"),
    ('{"gpus": [{"mode": "mig"}]}', "gpus[0].mig: list the MIG profiles"),
    ('{"gpus": [{"mode": "mig", "mig": ["big"]}]}', "gpus[0].mig[0]: 'big' is not a MIG profile"),
    (
        '{"gpus": [{"mode": "mig", "mig": ["4g.40gb", "4g.40gb"]}]}',
        "gpus[0].mig: uses 8 compute slices; a GPU has 7",
    ),
    (
        '{"gpus": [{"mode": "mig", "memory_mb": 40960, "mig": ["3g.40gb", "1g.10gb"]}]}',
        "gpus[0].mig: needs 50 GB; the GPU has 40960 MB",
    ),
    ('{"gpus": [{"mode": "whole", "mig": ["1g.10gb"]}]}', "gpus[0].mig: only for mode 'mig'"),
    ('{"gpus": [{"mode": "mps"}]}', "gpus[0].mps_shares: must be 1 or more for mode 'mps'; got 0"),
    ('{"gpus": [{"mode": "whole", "mps_shares": 2}]}', "gpus[0].mps_shares: only for mode 'mps'"),
]


@pytest.mark.parametrize(("value", "message"), BAD_DESCRIPTIONS)
def test_a_bad_description_is_refused_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        discover("node-e", source="described", description=value)
    assert str(caught.value).startswith("PORTAL_AGENT_INVENTORY: ")
    assert message in str(caught.value)


# --- NVML (through the fake) -----------------------------------------------------------------


def mig(
    uuid: str, profile_id: int, instance: int, slices: int, memory_mb: int, name: str
) -> FakeMig:
    return FakeMig(
        uuid=uuid,
        profile_id=profile_id,
        gpu_instance_id=instance,
        gpu_slices=slices,
        compute_slices=slices,
        memory_mb=memory_mb,
        name=f"NVIDIA A100-SXM4-80GB MIG {name}",
    )


def a_host() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                uuid="GPU-11111111-0000-0000-0000-000000000000",
                mig_capable=False,
                name="Tesla T4",
                memory_mb=15360,
            ),
            FakeGpu(
                uuid="GPU-22222222-0000-0000-0000-000000000000",
                mig_enabled=True,
                # slot 1 is empty: NVML answers NOT_FOUND there
                mig_slots=[
                    mig("MIG-aaaaaaaa-0000-0000-0000-000000000000", 9, 2, 3, 40192, "3g.40gb"),
                    None,
                    mig("MIG-bbbbbbbb-0000-0000-0000-000000000000", 19, 9, 1, 9728, "1g.10gb"),
                ],
            ),
            FakeGpu(uuid="GPU-33333333-0000-0000-0000-000000000000"),
        ]
    )


def test_nvml_reads_whole_gpus_with_model_memory_and_uuid() -> None:
    nvml = a_host()
    inventory = discover("node-f", nvml=nvml, hostname="gpu-host-f")
    assert inventory.driver == "nvml"
    assert inventory.hostname == "gpu-host-f"
    first = inventory.gpus[0]
    assert (first.uuid, first.index, first.model, first.memory_mb, first.mode) == (
        "GPU-11111111-0000-0000-0000-000000000000",
        0,
        "Tesla T4",
        15360,
        "whole",
    )
    assert inventory.gpus[2].mode == "whole"
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_nvml_lists_mig_devices_with_their_profiles() -> None:
    inventory = discover("node-f", nvml=a_host())
    gpu = inventory.gpus[1]
    assert gpu.mode == "mig"
    assert [(m.uuid, m.profile) for m in gpu.mig] == [
        ("MIG-aaaaaaaa-0000-0000-0000-000000000000", "3g.40gb"),
        ("MIG-bbbbbbbb-0000-0000-0000-000000000000", "1g.10gb"),
    ]


def test_a_compute_instance_smaller_than_its_gpu_instance_gets_the_c_prefix() -> None:
    nvml = a_host()
    small = nvml.gpus[1].mig_slots[0]
    assert small is not None
    small.compute_slices = 1
    assert discover("n", nvml=nvml).gpus[1].mig[0].profile == "1c.3g.40gb"


def test_without_instance_privileges_the_profile_comes_from_the_device_name() -> None:
    nvml = a_host()
    nvml.instance_queries_allowed = False
    assert [m.profile for m in discover("n", nvml=nvml).gpus[1].mig] == ["3g.40gb", "1g.10gb"]


def test_mps_mode_is_declared_by_gpu_index_or_uuid() -> None:
    by_index = discover("n", nvml=a_host(), mps_shares="2=4")
    assert (by_index.gpus[2].mode, by_index.gpus[2].mps_shares) == ("mps", 4)
    by_uuid = discover("n", nvml=a_host(), mps_shares="GPU-11111111-0000-0000-0000-000000000000=2")
    assert (by_uuid.gpus[0].mode, by_uuid.gpus[0].mps_shares) == ("mps", 2)
    assert by_uuid.gpus[2].mode == "whole"


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("1=4", "PORTAL_AGENT_MPS: GPU 1 is in MIG mode, not MPS"),
        ("7=4", "PORTAL_AGENT_MPS: no GPU 7 on this node"),
        ("2=zero", "PORTAL_AGENT_MPS: '2=zero' must be <gpu index or uuid>=<shares>"),
        ("2=0", "PORTAL_AGENT_MPS: '2=0' must be"),
    ],
)
def test_a_bad_mps_declaration_is_refused(declared: str, message: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(message)):
        discover("n", nvml=a_host(), mps_shares=declared)


def test_without_a_driver_auto_falls_back_to_the_described_inventory() -> None:
    nvml = FakeNvml([], driver_loaded=False)
    inventory = discover("node-g", nvml=nvml)
    assert inventory.driver == "described"
    assert len(inventory.gpus) == 4


def test_source_nvml_without_a_driver_is_an_error() -> None:
    with pytest.raises(InventoryError, match="PORTAL_AGENT_GPU_SOURCE=nvml but NVML init failed"):
        discover("n", source="nvml", nvml=FakeNvml([], driver_loaded=False))


def test_source_described_never_touches_nvml() -> None:
    nvml = a_host()
    assert discover("n", source="described", nvml=nvml).driver == "described"
    assert nvml.init_calls == 0


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(
        InventoryError, match="PORTAL_AGENT_GPU_SOURCE: must be one of auto, nvml, described"
    ):
        discover("n", source="gpu")
