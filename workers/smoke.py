"""A real GPU host, checked the way the agent uses it, without the portal (scripts/gpu-smoke.sh).

    python -m workers.smoke [--python PYTHON] [--gpu INDEX]

1. **Discovery**: the inventory through NVML (`discover(source="nvml")`), printed as the JSON
   the agent registers. No driver, no GPU: it says so and exits 2.
2. **MPS**: the GPU (`--gpu`, default the last one) declared in MPS mode with 2 shares, as
   `PORTAL_AGENT_MPS` would; the agent's `MpsSupervisor` starts its control daemon in a
   temporary MPS root and the daemon's `get_server_list` is read before and after the job.
3. **CUDA jobs through the process launcher** (the agent's own, configured from the same
   environment as the agent: job uids, limits, network): one on the whole GPU, one on an MPS
   share of it (through the supervisor, as the agent launches MPS jobs). Each runs
   `torch.cuda.is_available()` and a 1024 x 1024 matmul on the device it was given
   (CUDA_VISIBLE_DEVICES is the slice's) and prints the result and the device's name.

Exit 0 when every step passed, 1 naming the step that failed, 2 without a GPU. `--python` is
the interpreter the jobs run (it needs torch, and runs as a job uid when this is root:
every user must be able to run it).
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from workers.inventory import InventoryError, discover
from workers.launch import LaunchError
from workers.launchers import Launcher
from workers.launchers.process import process_launcher
from workers.lease import Lease, lease_path, write_lease
from workers.mps import CONTROL_BINARY, MpsLauncher, MpsSupervisor
from workers.protocol import Device, Gpu, Inventory, Launch
from workers.settings import AgentSettings, SettingsError

NODE = "gpu-smoke"
MPS_SHARES = 2
JOB_TIMEOUT_S = 300.0
# What each job runs: fails (exit 1) without CUDA, prints the device and a checked product.
CUDA_JOB = """\
import os, sys
for name in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
    print(name + "=" + os.environ.get(name, ""))
try:
    import torch
except ImportError as error:
    raise SystemExit(f"torch is not importable by {sys.executable}: {error} (see --python)")
available = torch.cuda.is_available()
print(f"torch {torch.__version__}: cuda available={available}")
if not available:
    raise SystemExit("torch.cuda.is_available() is False")
a = torch.ones(1024, 1024, device="cuda")
product = (a @ a).sum().item()
print(f"matmul on {torch.cuda.get_device_name(0)}: sum={product:.0f} (expected {1024 ** 3})")
raise SystemExit(0 if product == 1024 ** 3 else 1)
"""


class SmokeFailed(Exception):
    """A step failed; the message names it."""


def say(text: str) -> None:
    print(f"gpu-smoke: {text}", flush=True)


def settings_for(var_dir: Path, environ: Mapping[str, str]) -> AgentSettings:
    """The agent's settings from this environment (its limits, job uids, network), with a
    var dir and work directory of our own (laid out as the agent's: `<var>/agent`) and a
    throwaway key: nothing here talks to a portal."""
    workdir = var_dir / "agent"
    key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    env = {
        **environ,
        "PORTAL_AGENT_NODE": NODE,
        # The launcher refuses jobs while files of the var dir outside the work dir are open
        # to them: a var dir of our own, not whatever .var the checkout has.
        "PORTAL_VAR_DIR": str(var_dir),
        "PORTAL_AGENT_WORKDIR": str(workdir),
        "PORTAL_AGENT_MPS_ROOT": str(workdir / "mps"),
        "PORTAL_AGENT_KEY": key,
        "PORTAL_AGENT_LAUNCHER": "process",
        "PORTAL_AGENT_GPU_SOURCE": "nvml",
    }
    env.pop("PORTAL_AGENT_KEY_FILE", None)
    return AgentSettings.from_env(env)


def run_job(launcher: Launcher | MpsLauncher, launch: Launch) -> None:
    """Start it, print its output as it comes, fail unless it exits 0."""
    say(f"job {launch.name}: {' '.join(launch.command[:2])} ... on {launch.devices[0].kind} "
        f"{launch.devices[0].gpu_uuid}")  # fmt: skip
    try:
        run = launcher.start(launch)
    except LaunchError as error:
        raise SmokeFailed(f"job {launch.name}: the launcher refused it: {error}") from None
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        for chunk in run.output():
            for line in chunk.decode(errors="replace").splitlines():
                print(f"    {launch.name} | {line}", flush=True)
            if time.monotonic() > deadline:
                run.terminate(5.0)
                raise SmokeFailed(f"job {launch.name}: still running after {JOB_TIMEOUT_S:.0f} s")
        code = run.wait()
    finally:
        run.reap()
        run.release()
    if code != 0:
        raise SmokeFailed(f"job {launch.name}: exit code {code} (its output is above)")
    say(f"job {launch.name}: passed")


def launch_for(job_id: int, name: str, device: Device, python: str) -> Launch:
    return Launch(
        node=NODE,
        job_id=job_id,
        attempt=1,
        name=name,
        team="smoke",
        user="smoke",
        image="host",
        command=(python, "-c", CUDA_JOB),
        env={},
        devices=(device,),
    )


def pick(inventory: Inventory, index: int | None) -> Gpu:
    usable = [gpu for gpu in inventory.gpus if gpu.mode != "mig"]
    if not usable:
        raise SmokeFailed("discovery: every GPU is in MIG mode; this smoke test needs a whole GPU")
    if index is None:
        return usable[-1]
    for gpu in usable:
        if gpu.index == index:
            return gpu
    raise SmokeFailed(f"--gpu: {index} is not a GPU outside MIG mode (have: "
                      f"{', '.join(str(g.index) for g in usable)})")  # fmt: skip


def smoke(
    python: str,
    gpu_index: int | None,
    environ: Mapping[str, str],
    *,
    nvml: Any = None,
    mps_control: str | None = None,
) -> None:
    """The three steps; `nvml` replaces pynvml and `mps_control` the MPS control program found
    on PATH (the tests' fakes)."""
    try:
        inventory = discover(NODE, source="nvml", hostname=os.uname().nodename, nvml=nvml)
    except InventoryError as error:
        raise NoGpu(str(error)) from None
    if not inventory.gpus:
        raise NoGpu("NVML answers but lists no GPU")
    say("1. discovery (the inventory the agent registers):")
    print(msgspec.json.format(msgspec.json.encode(inventory)).decode(), flush=True)
    gpu = pick(inventory, gpu_index)

    var_dir = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    var_dir.chmod(0o711)  # job uids pass through to their own directories
    try:
        settings = settings_for(var_dir, environ)
        settings.workdir.mkdir(mode=0o711)
        launcher = process_launcher(settings)
        # The shims stop a job whose agent's lease lapsed; this run holds one for an hour.
        lease = Lease(valid_until=time.time() + 3600, boot="smoke")
        write_lease(lease_path(settings.workdir), lease)

        say(f"2. MPS: GPU {gpu.index} with {MPS_SHARES} shares; the agent's supervisor starts "
            "its control daemon")  # fmt: skip
        binary = mps_control or shutil.which(CONTROL_BINARY)
        if binary is None:
            raise SmokeFailed(f"MPS: {CONTROL_BINARY} is not on PATH (it comes with the driver)")
        mps_inventory = discover(
            NODE,
            source="nvml",
            hostname=inventory.hostname,
            mps_shares=f"{gpu.uuid}={MPS_SHARES}",
            nvml=nvml,
        )
        supervisor = MpsSupervisor(mps_inventory, settings.mps_root, binary=binary,
                                   kill_grace_s=settings.kill_grace_s)  # fmt: skip
        try:
            supervisor.prepare()
            daemon = supervisor.daemons[gpu.uuid]
            if not daemon.up:
                raise SmokeFailed(f"MPS: the control daemon did not start: {daemon.last_death}")
            say(f"MPS control daemon up, pipe {daemon.pipe}; server list before the jobs: "
                f"{supervisor.server_list(gpu.uuid)!r}")  # fmt: skip
            whole = Device(slice_id="smoke-whole", kind="whole", gpu_uuid=gpu.uuid,
                           gpu_index=gpu.index, memory_mb=gpu.memory_mb)  # fmt: skip
            say(f"3a. a CUDA job on the whole GPU {gpu.index} ({gpu.uuid}, {gpu.model})")
            run_job(launcher, launch_for(1, "whole-gpu", whole, python))

            share = Device(slice_id="smoke-mps-0", kind="mps", gpu_uuid=gpu.uuid,
                           gpu_index=gpu.index, mps_fraction=1 / MPS_SHARES,
                           memory_mb=gpu.memory_mb // MPS_SHARES)  # fmt: skip
            say(f"3b. a CUDA job on an MPS share (1 of {MPS_SHARES}) of GPU {gpu.index}")
            run_job(supervisor.watch(launcher), launch_for(2, "mps-share", share, python))
            say(f"server list after the jobs: {supervisor.server_list(gpu.uuid)!r}")
        finally:
            supervisor.stop()
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)


class NoGpu(Exception):
    """No driver or no GPU on this machine."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=shutil.which("python3") or sys.executable,
                        help="the interpreter the CUDA jobs run (needs torch)")  # fmt: skip
    parser.add_argument("--gpu", type=int, default=None, help="GPU index (default: the last)")
    args = parser.parse_args(argv)
    try:
        smoke(args.python, args.gpu, os.environ)
    except NoGpu as error:
        say(f"FAILED: no GPU here: {error}")
        return 2
    except (SmokeFailed, SettingsError) as error:
        say(f"FAILED: {error}")
        return 1
    say("PASSED: discovery, MPS daemon, CUDA on a whole GPU and on an MPS share")
    return 0


if __name__ == "__main__":
    sys.exit(main())
