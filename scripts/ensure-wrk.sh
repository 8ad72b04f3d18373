#!/usr/bin/env bash
# Debian's wrk, the HTTP load generator of `make bench-api`, which cannot run without it.
exec bash "$(dirname "$0")/ensure-package.sh" ensure-wrk wrk wrk "make bench-api" required
