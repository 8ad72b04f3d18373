#!/usr/bin/env bash
# Smoke test of a real GPU host, without the portal: run it on the host, from the repository.
#
#   scripts/gpu-smoke.sh [--python /path/to/python-with-torch] [--gpu INDEX]
#
# What the agent itself would do, through its own code (workers/smoke.py):
#   1. NVML discovery, printed as the inventory the agent registers;
#   2. the MPS control daemon of one GPU started by the agent's MPS supervisor, and its
#      server list read (`get_server_list`);
#   3. a CUDA job through the process launcher, torch.cuda.is_available() and a small matmul
#      on the discovered device: once on the whole GPU, once on an MPS share of it.
# Exit 0: all passed. 1: a step failed (named). 2: no GPU or no NVIDIA driver here.
# As root the jobs run as job uids (PORTAL_AGENT_JOB_UIDS): --python must be runnable by
# every user and have torch (default: python3 on PATH).
set -euo pipefail

cd "$(dirname "$0")/.."
python=.venv/bin/python
if [ ! -x "$python" ]; then
    python=python3
fi
if ! "$python" -c "import workers.smoke" 2>/dev/null; then
    echo "gpu-smoke: cannot import the agent's code with $python; run 'make install' first" >&2
    exit 1
fi
exec "$python" -m workers.smoke "$@"
