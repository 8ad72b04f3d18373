#!/usr/bin/env bash
# iproute2's `ip` for the many-hosts test (tests/e2e/test_many_hosts.py makes a network
# namespace per host with `ip netns` and veth pairs, and enters them with util-linux's
# `nsenter`, which every Debian has). Without it that test skips, saying why.
exec bash "$(dirname "$0")/ensure-package.sh" ensure-iproute2 iproute2 ip "the many-hosts test"
