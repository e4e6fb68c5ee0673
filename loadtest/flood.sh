#!/usr/bin/env bash
# Slow clients and floods against the release kvgate binary, at full size: 10,000 idle keep-alive
# connections, 1,000 header tricklers, 200 slow readers of long streams and 20,000
# connect-and-close connections, all at once, while a well-behaved client makes sequential
# requests (measured alone first, then during the flood, in the same run).
#
# Prints the good client's p50/p99 latency alone and during the flood, the connections of each
# kind opened and closed (and by which limit, from kvgate_connections_closed_total), the gateway's
# peak RSS (VmHWM) and RSS at the end, and the memory bound computed from its config next to the
# peak. The scenario is the `full_size` test of tests/flood.rs (the same code as the CI-size test);
# the checks of that test apply and fail the run.
#
# Usage: loadtest/flood.sh [--idle 10000] [--tricklers 1000] [--slow 200] [--connects 20000]
#                          [--idle-ms 20000]
# Needs: cargo; a hard descriptor limit above the connections (raised to it here).
set -euo pipefail

while [ $# -gt 0 ]; do
    case "$1" in
        --idle) export KVGATE_FLOOD_IDLE="$2"; shift 2 ;;
        --tricklers) export KVGATE_FLOOD_TRICKLERS="$2"; shift 2 ;;
        --slow) export KVGATE_FLOOD_SLOW="$2"; shift 2 ;;
        --connects) export KVGATE_FLOOD_CONNECTS="$2"; shift 2 ;;
        --idle-ms) export KVGATE_FLOOD_IDLE_MS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
# The test raises its own soft limit too; this covers cargo and the shell's children alike.
ulimit -n "$(ulimit -Hn)"
echo "descriptor limit: $(ulimit -n)"
cargo test --release --test flood -- --ignored --exact full_size --nocapture --test-threads 1
