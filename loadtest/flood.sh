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
# With --at-cap it runs the flood at the connection cap instead (`full_size_at_the_cap`): the
# cap (--cap, 10,000) filled with idle connections, half silent and half kept alive after one
# request, then --connects connect-and-close connections while legitimate clients open a new
# connection for each of --requests requests (5,000); it prints the requests served, their p50/p99
# latency, the idle connections closed and kvgate_connections_evicted_total by reason.
#
# Usage: loadtest/flood.sh [--idle 10000] [--tricklers 1000] [--slow 200] [--connects 20000]
#                          [--idle-ms 20000]
#        loadtest/flood.sh --at-cap [--cap 10000] [--connects 20000] [--requests 5000]
# Needs: cargo; a hard descriptor limit above the connections (raised to it here).
set -euo pipefail

test=full_size
while [ $# -gt 0 ]; do
    case "$1" in
        --at-cap) test=full_size_at_the_cap; shift ;;
        --cap) export KVGATE_FLOOD_CAP="$2"; shift 2 ;;
        --requests) export KVGATE_FLOOD_REQUESTS="$2"; shift 2 ;;
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
cargo test --release --test flood -- --ignored --exact "$test" --nocapture --test-threads 1
