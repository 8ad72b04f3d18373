#!/usr/bin/env bash
# Make sure iproute2's `ip` is there for the many-hosts test (tests/e2e/test_many_hosts.py makes
# a network namespace per host with `ip netns` and veth pairs, and enters them with util-linux's
# `nsenter`, which every Debian has). Installs it when we are root with apt-get; otherwise says
# so, and the test skips with the same reason.
set -uo pipefail

if command -v ip >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-iproute2: 'ip' is missing and this is not root with apt-get;" \
        "the many-hosts test will skip (install Debian's 'iproute2' package to run it)" >&2
    exit 0
fi
echo "ensure-iproute2: installing Debian's iproute2 for the many-hosts test ..."
export DEBIAN_FRONTEND=noninteractive
install_it() { apt-get install -y -qq --no-install-recommends iproute2 >/dev/null; }
# A fresh machine may have no package lists yet: update once, then install.
if ! install_it 2>/dev/null; then
    apt-get update -qq && install_it
fi
command -v ip >/dev/null 2>&1 || echo "ensure-iproute2: could not install iproute2; the many-hosts test will skip" >&2
exit 0
