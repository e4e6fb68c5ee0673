#!/usr/bin/env bash
# The gateway sizing table: CPU cores and memory kvgate itself needs per 100 req/s, by prompt
# length (1K, 8K, 32K, 100K tokens), traffic (unique prompts, multi-turn conversations), hash mode
# (token, text), placement index size (1M, 10M entries) and server.threads (1, 2).
#
# Set-up, all on 127.0.0.1 free ports: 4 static backends in one nginx (2 workers) answering every
# request with a fixed small chat completion, as overhead.sh's do, so the backend costs next to
# nothing and is not what is measured (its CPU is reported beside the gateway's); for each hash
# mode × index size × thread count a fresh release kvgate (policy kvgate, engine load scraping
# off, predictions kept for an hour so the fill stays in the index, routing.index.max_entries =
# the index size) in front of them; and `kvgate-loadtest sizing-drive`, which
#   1. fills the index through real requests (unique prompts of 64K token ids in token mode, 64K
#      words in text mode) until the gateway's kvgate_index_entries gauge reads the index size,
#      then records RSS and the gateway's CPU for a few seconds with no traffic (idle cores: the
#      expiry sweep over the index, health checks, timers);
#   2. for each prompt length and traffic kind: a short closed-loop pilot, a 1 s warm-up, then
#      --duration seconds open loop at --rate requests per second, reading the gateway's CPU
#      seconds (/proc/PID/stat utime + stime) and RSS (VmRSS, VmHWM) around the window; a cell
#      the pilot says would need more than --budget-cores at --rate runs at a lower rate (marked
#      in the table), since a saturated machine would measure queueing, not the gateway.
# Cores per 100 req/s = the window's CPU above idle per request × 100 + the idle cores (the
# measured cores when the cell ran at 100 req/s). CPU seconds per request are what other load on
# a shared machine moves least; latency (client → kvgate → static backend) moves with it.
# Multi-turn: 64 conversations at once, each request = the conversation's previous request +
# an answer + a new user message (min(1024, L/8) tokens, answers an eighth of that), up to 40
# turns, staggered so that one request in `turns` opens a new conversation; prompts average L.
#
# Usage: loadtest/sizing.sh [--quick] [--duration 6] [--rate 100] [--budget-cores 0.8]
#                           [--lengths 1024,8192,32768,102400] [--kinds unique,multi]
#                           [--modes "token text"] [--entries "1000000 10000000"]
#                           [--threads "1 2"] [--bin DIR] [--out DIR]
# --quick: one gateway (token mode, 100k entries, 2 threads), one cell (100K multi-turn), 3 s.
# --entries 0: the index as configured by default and not filled first (a new gateway).
# --bin DIR: a directory with already built kvgate and kvgate-loadtest release binaries.
# Writes DIR (default loadtest/results/sizing): summary.md, cells.md, cells.csv, cells.json,
# cells.jsonl and each gateway's log; prints the summary. The default run takes ~15 minutes.
# Needs: nginx (installed from Debian when missing, as root), python3, curl, cargo.
set -euo pipefail

DURATION=6
RATE=100
BUDGET=0.8
LENGTHS=1024,8192,32768,102400
KINDS=unique,multi
MODES="token text"
ENTRIES="1000000 10000000"
THREADS="1 2"
BIN=""
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) LENGTHS=102400; KINDS=multi; MODES=token; ENTRIES=100000; THREADS=2; DURATION=3; shift ;;
        --duration) DURATION="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --budget-cores) BUDGET="$2"; shift 2 ;;
        --lengths) LENGTHS="$2"; shift 2 ;;
        --kinds) KINDS="$2"; shift 2 ;;
        --modes) MODES="$2"; shift 2 ;;
        --entries) ENTRIES="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT="${OUT:-$ROOT/loadtest/results/sizing}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in python3 curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "needs $tool" >&2; exit 2; }
done
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "installing nginx-light from Debian" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "$BIN" ]; then
    echo "building kvgate and kvgate-loadtest (release)" >&2
    cargo build --release --bin kvgate --bin kvgate-loadtest -p kvgate -p kvgate-loadtest -q
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
KVGATE="$BIN/kvgate"
DRIVER="$BIN/kvgate-loadtest"
for b in "$KVGATE" "$DRIVER"; do [ -x "$b" ] || { echo "no binary at $b" >&2; exit 2; }; done

# shellcheck source=lib/harness.sh
. "$ROOT/loadtest/lib/harness.sh"
harness_init sizing

B=()
for _ in 1 2 3 4; do B+=("$(free_port)"); done

# The backends: one nginx with 2 workers and 4 static servers, as in overhead.sh (bodies up to
# 64 MiB accepted and discarded).
{
    echo "worker_processes 2;"
    echo "pid $WORK/nginx.pid;"
    echo "error_log $WORK/nginx-error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  access_log off;"
    echo "  client_max_body_size 64m;"
    echo "  client_body_buffer_size 64k;"
    echo "  client_body_temp_path $WORK/body; proxy_temp_path $WORK/proxy;"
    echo "  fastcgi_temp_path $WORK/fcgi; uwsgi_temp_path $WORK/uwsgi; scgi_temp_path $WORK/scgi;"
    echo "  keepalive_requests 1000000;"
    for p in "${B[@]}"; do
        echo "  server { listen 127.0.0.1:$p; location / { default_type application/json;"
        echo "    return 200 '{\"id\":\"cmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}'; } }"
    done
    echo "}"
} >"$WORK/nginx.conf"
"$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
wait_ready "http://127.0.0.1:${B[0]}/" 20
BACKEND_PIDS="$NGINX_PID,$(pgrep -P "$NGINX_PID" | paste -sd,)"

CELLS="$OUT/cells.jsonl"
: >"$CELLS"
echo "sizing: modes [$MODES], index [$ENTRIES], threads [$THREADS], lengths $LENGTHS, kinds $KINDS," \
    "$RATE req/s, ${DURATION}s per cell, $(nproc) cores" >&2
for mode in $MODES; do
    for entries in $ENTRIES; do
        for threads in $THREADS; do
            PORT=$(free_port)
            name="$mode-$entries-t$threads"
            {
                echo "[server]"
                echo "listen = \"127.0.0.1:$PORT\""
                # The drive scrapes /metrics at the gateway's URL.
                echo "admin_listen = \"main\""
                echo "log_filter = \"warn\""
                echo "threads = $threads"
                echo "[load]"
                echo "enabled = false"
                echo "[routing]"
                echo "hash_mode = \"$mode\""
                echo "predicted_ttl_ms = 3600000"
                if [ "$entries" -gt 0 ]; then
                    echo "[routing.index]"
                    echo "max_entries = $entries"
                    echo "default_instance_capacity = $entries"
                fi
                echo "[[pools]]"
                echo "model = \"m\""
                for p in "${B[@]}"; do echo "[[pools.instances]]"; echo "url = \"http://127.0.0.1:$p\""; done
            } >"$WORK/$name.toml"
            "$KVGATE" --config "$WORK/$name.toml" >"$OUT/kvgate-$name.log" 2>&1 &
            KV=$!
            PIDS+=("$KV")
            wait_ready "http://127.0.0.1:$PORT/ready" 60
            echo "gateway $name (pid $KV)" >&2
            "$DRIVER" sizing-drive --url "http://127.0.0.1:$PORT" --pid "$KV" \
                --backend-pids "$BACKEND_PIDS" --mode "$mode" --threads "$threads" \
                --index-entries "$entries" --lengths "$LENGTHS" --kinds "$KINDS" \
                --rate "$RATE" --budget-cores "$BUDGET" --duration-s "$DURATION" --out "$CELLS"
            kill "$KV" 2>/dev/null || true
            wait "$KV" 2>/dev/null || true
        done
    done
done

echo >&2
echo "kvgate sizing ($(nproc) cores, $("$KVGATE" --version 2>/dev/null | head -n 1), $RATE req/s asked, ${DURATION}s windows)"
echo
"$DRIVER" sizing-report --cells "$CELLS" --out-dir "$OUT"
echo "tables: $OUT/summary.md, $OUT/cells.md, $OUT/cells.csv, $OUT/cells.json" >&2
