#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium; it never
# downloads a browser of its own), with its recommended extras (the fonts its pages and
# screenshots are drawn with). Without it the browser tests skip, saying why.
RECOMMENDS=1 exec bash "$(dirname "$0")/ensure-package.sh" ensure-chromium chromium /usr/bin/chromium \
    "the browser tests"
