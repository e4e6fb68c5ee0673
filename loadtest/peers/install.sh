#!/bin/sh
# Installs the external routers that `kvgate-loadtest compare` can run beside kvgate
# (smg, sglang-router and vllm-router, all Rust binaries shipped as Python wheels) into a venv.
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
SMG_VERSION="1.13.0"

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet \
    "sglang-router==$SGLANG_ROUTER_VERSION" \
    "vllm-router==$VLLM_ROUTER_VERSION" \
    "smg==$SMG_VERSION"

# sglang-router installs a `smg` script of its own (an alias of its CLI), so bin/smg belongs to
# whichever package pip wrote last. Make it smg's, as its docs assume; kvgate-loadtest runs
# `python -m smg`, which does not depend on this.
case "$("$VENV/bin/smg" --version 2>/dev/null)" in
    "smg $SMG_VERSION") ;;
    *) "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "smg==$SMG_VERSION" ;;
esac

echo "installed:"
"$VENV/bin/python" -m pip show smg sglang-router vllm-router | grep -E '^(Name|Version):'
echo
echo "use with: kvgate-loadtest compare --python $VENV/bin/python --contenders kvgate,smg,sglang-router,vllm-router ..."
