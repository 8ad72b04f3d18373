#!/usr/bin/env bash
# Make sure Debian's Chromium is there for the browser test (Playwright drives /usr/bin/chromium;
# it never downloads a browser of its own). Installs it when we are root with apt-get;
# otherwise says so, and the browser test skips with the same message.
set -uo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: /usr/bin/chromium is missing and this is not root with apt-get;" \
        "the browser test will skip (install Debian's 'chromium' package to run it)" >&2
    exit 0
fi
echo "ensure-chromium: installing Debian's chromium for the browser test ..."
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once, then install.
if ! apt-get install -y -qq chromium >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
if [ -x /usr/bin/chromium ]; then
    echo "ensure-chromium: $(/usr/bin/chromium --version 2>/dev/null || echo chromium installed)"
else
    echo "ensure-chromium: could not install chromium; the browser test will skip" >&2
fi
exit 0
