#!/usr/bin/env bash
# The official `openai` Python client against the kvgate binary (tests/e2e/openai_client.py):
# whole answers through it, and a stream an engine breaks off raised as an APIError.
#
#   KVGATE_BIN=target/release/kvgate tests/e2e/openai_client.sh
#
# The venv (PyPI's openai, pinned) is cached in ${XDG_CACHE_HOME:-~/.cache}/kvgate-ci/openai.
set -euo pipefail

OPENAI_VERSION=3.57.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/kvgate-ci/openai-$OPENAI_VERSION"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    echo "installing openai $OPENAI_VERSION (PyPI) into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi
export KVGATE_BIN="${KVGATE_BIN:-$ROOT/target/release/kvgate}"
timeout 300 "$VENV/bin/python" "$HERE/openai_client.py"
