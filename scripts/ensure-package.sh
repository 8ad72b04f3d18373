#!/usr/bin/env bash
# Make sure a program from one of Debian's packages is there for a test or a benchmark; the
# one install step behind scripts/ensure-*.sh.
#
#   scripts/ensure-package.sh NAME PACKAGE PROGRAM WHAT [required]
#
# NAME prefixes what it says, PACKAGE is Debian's package, PROGRAM the path or command that
# must exist afterwards, WHAT what needs it ("the browser test"). Installs the package when we
# are root with apt-get (without its recommended extras unless RECOMMENDS=1), updating the
# package lists once if the first try fails (a fresh machine may have none). When the program cannot be had, it says so
# and exits 0 (the test skips, saying the same), or 1 with `required`.
set -uo pipefail
name=$1 package=$2 program=$3 what=$4 required=${5:-}
missing=0
[ "$required" = required ] && missing=1

present() { command -v "$program" >/dev/null 2>&1 || [ -x "$program" ]; }

if present; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: $program is missing and this is not root with apt-get; install Debian's" \
        "'$package' package for $what" >&2
    exit "$missing"
fi
echo "$name: installing Debian's $package for $what ..."
export DEBIAN_FRONTEND=noninteractive
options=(--no-install-recommends)
[ "${RECOMMENDS:-}" = 1 ] && options=()
install_it() { apt-get install -y -qq "${options[@]}" "$package" >/dev/null; }
if ! install_it 2>/dev/null; then
    apt-get update -qq && install_it
fi
if present; then
    echo "$name: $("$program" --version 2>/dev/null | head -1 || echo "$package installed")"
    exit 0
fi
echo "$name: could not install $package; $what cannot run" >&2
exit "$missing"
