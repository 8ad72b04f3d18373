#!/usr/bin/env bash
# Make sure Debian's Docker engine (dockerd, from the docker.io package) is there for the
# Docker engine test (tests/workers/test_docker_engine.py starts a dockerd of its own, on its
# own socket and data directory; it never uses or starts the host's Docker service).
# Installs it when we are root with apt-get; otherwise says so, and the test skips.
set -uo pipefail

if command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-dockerd: dockerd is missing and this is not root with apt-get;" \
        "the Docker engine test will skip (install Debian's 'docker.io' package to run it)" >&2
    exit 0
fi
echo "ensure-dockerd: installing Debian's docker.io for the Docker engine test ..."
export DEBIAN_FRONTEND=noninteractive
# Only the engine and what it depends on (containerd, runc, iptables, tini): the test imports
# its image from a tarball and needs none of the recommended extras.
install_engine() { apt-get install -y -qq --no-install-recommends docker.io >/dev/null; }
# A fresh machine may have no package lists yet: update once, then install.
if ! install_engine 2>/dev/null; then
    apt-get update -qq && install_engine
fi
if [ -x /usr/sbin/dockerd ]; then
    echo "ensure-dockerd: $(/usr/sbin/dockerd --version 2>/dev/null || echo dockerd installed)"
else
    echo "ensure-dockerd: could not install docker.io; the Docker engine test will skip" >&2
fi
exit 0
