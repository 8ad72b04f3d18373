#!/usr/bin/env bash
# Make sure Debian's wrk (the HTTP load generator of `make bench-api`) is there. Installs it
# when we are root with apt-get; otherwise says so and exits 1: the API benchmark needs it.
set -uo pipefail

if command -v wrk >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-wrk: wrk is missing and this is not root with apt-get;" \
        "install Debian's 'wrk' package to run make bench-api" >&2
    exit 1
fi
echo "ensure-wrk: installing Debian's wrk for the API benchmark ..."
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once, then install.
if ! apt-get install -y -qq wrk >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
if command -v wrk >/dev/null 2>&1; then
    echo "ensure-wrk: $(wrk --version 2>&1 | head -1)"
else
    echo "ensure-wrk: could not install wrk" >&2
    exit 1
fi
