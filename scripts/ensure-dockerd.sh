#!/usr/bin/env bash
# Debian's Docker engine (docker.io) for tests/workers/test_docker_engine.py, which starts a
# dockerd of its own, on its own socket and data directory (never the host's Docker service),
# and imports its image from a tarball. Without it that test skips, saying why.
exec bash "$(dirname "$0")/ensure-package.sh" ensure-dockerd docker.io /usr/sbin/dockerd \
    "the Docker engine test"
