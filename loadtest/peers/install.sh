#!/bin/sh
# Installs the external routers that `kvgate-loadtest compare` can run beside kvgate
# (sglang-router and vllm-router, both Rust binaries shipped as Python wheels) into a venv.
#
#   loadtest/peers/install.sh            # venv in ~/.cache/kvgate-peers/venv
#   KVGATE_PEERS_VENV=/path loadtest/peers/install.sh
#
# Versions are pinned so comparisons are reproducible; the report records them again.
set -eu

VENV="${KVGATE_PEERS_VENV:-$HOME/.cache/kvgate-peers/venv}"
PYTHON="${PYTHON:-python3}"
SGLANG_ROUTER_VERSION="0.3.2"
VLLM_ROUTER_VERSION="0.1.17"

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet \
    "sglang-router==$SGLANG_ROUTER_VERSION" \
    "vllm-router==$VLLM_ROUTER_VERSION"

echo "installed:"
"$VENV/bin/python" -m pip show sglang-router vllm-router | grep -E '^(Name|Version):'
echo
echo "use with: kvgate-loadtest compare --python $VENV/bin/python --contenders kvgate,sglang-router,vllm-router ..."
