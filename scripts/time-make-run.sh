#!/usr/bin/env bash
# Time `make run` from a fresh clone to the first page served, as a newcomer would see it.
#
#   scripts/time-make-run.sh [SOURCE_REPO] [PORT]
#
# Clones SOURCE_REPO (default: this repository; only committed files travel) into a new
# temporary folder, runs `make run` there with nothing set (embedded default), waits until
# the login page answers 200, prints the seconds it took, then stops it with SIGINT (what
# Ctrl-C does) and checks that it exited 0. Set PIP_NO_CACHE_DIR=1 to time a cold pip cache.
set -euo pipefail

source_repo=${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}
port=${2:-8000}
clone=$(mktemp -d /tmp/fresh-XXXXXX)
log="$clone.log"

git clone --quiet "$source_repo" "$clone"
cd "$clone"
unset DATABASE_URL REDIS_URL PORTAL_BROKER_URL PORTAL_VAR_DIR VIRTUAL_ENV

start=$(date +%s.%N)
setsid make run ARGS="--port $port" >"$log" 2>&1 &
make_pid=$!

code=000
for _ in $(seq 1 1200); do
    code=$(curl -s -L -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/" || true)
    if [ "$code" = 200 ]; then break; fi
    if ! kill -0 "$make_pid" 2>/dev/null; then break; fi
    sleep 0.5
done
end=$(date +%s.%N)

if [ "$code" = 200 ]; then
    printf 'make run: first page served after %.1f s (clone in %s, log in %s)\n' \
        "$(echo "$end - $start" | bc)" "$clone" "$log"
else
    echo "make run: no page served (last HTTP code $code); log in $log" >&2
fi

# Ctrl-C in a terminal signals the whole foreground group: make and runportal.
kill -INT -- "-$make_pid" 2>/dev/null || true
status=0
wait "$make_pid" || status=$?
echo "make run exited with $status after SIGINT"
[ "$code" = 200 ]
