#!/usr/bin/env bash
# The wheels that `pip install ./clients/python` needs, in a folder, so that a clean venv can
# install the client with no index (`pip install --no-index --find-links DIR ./clients/python`):
# its dependencies (httpx, tqdm, PyYAML and theirs) and the build backend (setuptools, wheel).
# tests/client/test_clean_install.py installs from it; `make install` fills it (the one
# download), again only when clients/python/pyproject.toml is newer than the folder's stamp.
#
#   scripts/client-wheelhouse.sh [DIR]      (default .var/client-wheelhouse; PY=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=${1:-.var/client-wheelhouse}
STAMP="$DEST/.complete"
if [ -f "$STAMP" ] && [ "$STAMP" -nt clients/python/pyproject.toml ]; then
	exit 0
fi
mkdir -p "$DEST"
"$PY" -m pip download --disable-pip-version-check --quiet --dest "$DEST" \
	setuptools wheel ./clients/python
touch "$STAMP"
