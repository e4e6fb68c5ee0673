#!/usr/bin/env bash
# Measures what kvgate costs as a proxy, against nginx, in one run on this machine.
#
# Targets (all on 127.0.0.1): `direct` — wrk straight to one static backend (nginx returning a
# fixed small JSON); `nginx` — nginx as a plain keep-alive reverse proxy to 4 such backends;
# `kvgate` — the release build of kvgate (text-mode hashing, policy $POLICY) in front of the same 4.
# The backends run in their own nginx (2 workers) and the nginx proxy in another (2 workers), so
# both proxies reach the backends across processes alike (a proxy sharing worker processes with
# its backends would hand many requests to itself without a context switch).
# Each target is measured with 1 and 32 connections, with a small and a ~32 KiB POST body, for
# $DURATION each. Prints a Markdown table with kvgate/nginx throughput ratios and the p50 latency
# each proxy adds over the direct path, then the kvgate/nginx ratio of every round and its median
# (on a shared machine the steadier figure: each pair ran back to back, in alternating order).
#
# Usage: loadtest/overhead.sh [--duration 10s] [--rounds 1] [--policy round_robin|kvgate|...]
#                              [--bin PATH] [--tls]
# --rounds N measures every cell N times, interleaving the paths, and reports medians (errors are
# summed); --bin measures an already built kvgate binary instead of building the release one;
# --tls puts TLS on both proxies' listeners (one self-signed ECDSA P-256 pair, TLS 1.3 both
# sides; wrk keeps its connections, so this measures record encryption and decryption, with
# one handshake per connection) while the backends stay plain HTTP and the direct path stays
# plain: "added p50" then includes what TLS adds.
# Needs: wrk and nginx (installed from Debian when missing, as root), cargo, openssl for --tls.
set -euo pipefail

DURATION=10s
POLICY=round_robin
BIN=""
ROUNDS=1
TLS=false
while [ $# -gt 0 ]; do
    case "$1" in
        --tls) TLS=true; shift ;;
        --duration) DURATION="$2"; shift 2 ;;
        --policy) POLICY="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
ROOT=$(pwd)

need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]} from Debian" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "$BIN" ]; then
    echo "building kvgate (release)" >&2
    cargo build --release --bin kvgate -q
    BIN="$ROOT/target/release/kvgate"
fi

# shellcheck source=lib/harness.sh
. "$ROOT/loadtest/lib/harness.sh"
harness_init overhead

B=()
for _ in 1 2 3 4; do B+=("$(free_port)"); done
NGINX_PORT=$(free_port)
KVGATE_PORT=$(free_port)
SCHEME=http
NGINX_LISTEN="127.0.0.1:$NGINX_PORT"
CURL_TLS=()
if $TLS; then
    SCHEME=https
    NGINX_LISTEN="127.0.0.1:$NGINX_PORT ssl"
    CURL_TLS=(--cacert "$WORK/tls.crt")
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" \
        -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
fi

# Static backends: one nginx with 2 workers (one per core).
{
    echo "worker_processes 2;"
    echo "pid $WORK/nginx.pid;"
    echo "error_log $WORK/nginx-error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  access_log off;"
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
# The reverse proxy: another nginx with 2 workers.
mkdir -p "$WORK/proxy-prefix"
{
    echo "worker_processes 2;"
    echo "pid $WORK/nginx-proxy.pid;"
    echo "error_log $WORK/nginx-proxy-error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  access_log off;"
    echo "  client_body_buffer_size 64k;"
    echo "  client_body_temp_path $WORK/pbody; proxy_temp_path $WORK/pproxy;"
    echo "  fastcgi_temp_path $WORK/pfcgi; uwsgi_temp_path $WORK/puwsgi; scgi_temp_path $WORK/pscgi;"
    echo "  keepalive_requests 1000000;"
    echo "  upstream backends { keepalive 256;"
    for p in "${B[@]}"; do echo "    server 127.0.0.1:$p;"; done
    echo "  }"
    echo "  server { listen $NGINX_LISTEN;"
    if $TLS; then
        echo "    ssl_certificate $WORK/tls.crt; ssl_certificate_key $WORK/tls.key;"
        echo "    ssl_protocols TLSv1.3; ssl_session_cache off;"
    fi
    echo "    location / {"
    echo "    proxy_pass http://backends; proxy_http_version 1.1; proxy_set_header Connection \"\";"
    echo "    proxy_buffering off; } }"
    echo "}"
} >"$WORK/nginx-proxy.conf"
"$NGINX" -p "$WORK/proxy-prefix" -c "$WORK/nginx-proxy.conf" -g 'daemon off;' &
PIDS+=($!)
NGINX_PROXY_PID=$!
"$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' &
PIDS+=($!)

{
    echo "[server]"
    echo "listen = \"127.0.0.1:$KVGATE_PORT\""
    # No admin listener on its default fixed port: one port per run.
    echo "admin_listen = \"main\""
    echo "log_filter = \"warn\""
    if $TLS; then
        echo "[server.tls]"
        echo "cert_file = \"$WORK/tls.crt\""
        echo "key_file = \"$WORK/tls.key\""
    fi
    echo "[load]"
    echo "enabled = false"
    echo "[routing]"
    echo "hash_mode = \"text\""
    echo "[routing.policy]"
    echo "name = \"$POLICY\""
    echo "[[pools]]"
    echo "model = \"m\""
    for p in "${B[@]}"; do echo "[[pools.instances]]"; echo "url = \"http://127.0.0.1:$p\""; done
} >"$WORK/kvgate.toml"
"$BIN" --config "$WORK/kvgate.toml" &
PIDS+=($!)
KVGATE_PID=$!

for _ in $(seq 1 100); do
    if curl -fsS "${CURL_TLS[@]}" "$SCHEME://127.0.0.1:$KVGATE_PORT/ready" >/dev/null 2>&1 \
        && curl -fsS "${CURL_TLS[@]}" "$SCHEME://127.0.0.1:$NGINX_PORT/" >/dev/null 2>&1; then
        break
    fi
    sleep 0.1
done

# Request bodies: a small chat request and a ~32 KiB one.
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
small = {"model": "m", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                    {"role": "user", "content": "Say hello."}], "max_tokens": 16}
big_text = ("The quick brown fox jumps over the lazy dog. " * 800)[:32 * 1024 - 200]
large = {"model": "m", "messages": [{"role": "user", "content": big_text}], "max_tokens": 16}
for name, body in (("small", small), ("large", large)):
    b = json.dumps(body)
    with open(f"{work}/{name}.lua", "w") as f:
        f.write('wrk.method = "POST"\n')
        f.write('wrk.headers["Content-Type"] = "application/json"\n')
        f.write("wrk.body = " + json.dumps(b) + "\n")
        f.write('''done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %.1f %.1f %.1f %d %d\\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout + e.status, summary.requests))
end
''')
PY

# CPU time (user + system, in clock ticks) of a process, its threads and its child processes:
# what a proxy spends, whatever else runs on the machine.
cpu_ticks() {
    local total=0 pid t
    for pid in "$1" $(pgrep -P "$1" || true); do
        for t in /proc/"$pid"/task/*/stat; do
            [ -r "$t" ] && total=$((total + $(awk '{ print $14 + $15 }' "$t" 2>/dev/null || echo 0)))
        done
    done
    echo "$total"
}
TICKS=$(getconf CLK_TCK)

declare -A RPS P50 P99 ERR CPU ROUND_RATIOS
run_cell() { # target url conns body [pid]: appends this round's figures to the cell's lists
    local target=$1 url=$2 conns=$3 body=$4 pid=${5:-} threads=1
    [ "$conns" -gt 1 ] && threads=2
    local out k="$1,$3,$4" before=0 after=0
    [ -n "$pid" ] && before=$(cpu_ticks "$pid")
    out=$(wrk -t"$threads" -c"$conns" -d"$DURATION" --latency -s "$WORK/$body.lua" "$url" 2>&1 | grep '^RESULT' || true)
    [ -n "$pid" ] && after=$(cpu_ticks "$pid")
    read -r _ rps p50 p99 err n <<<"${out:-RESULT 0 0 0 -1 0}"
    RPS[$k]="${RPS[$k]:-} $rps"
    P50[$k]="${P50[$k]:-} $p50"
    P99[$k]="${P99[$k]:-} $p99"
    ERR[$k]=$(( ${ERR[$k]:-0} + err ))
    local cpu=""
    if [ -n "$pid" ] && [ "${n:-0}" -gt 0 ]; then
        cpu=$(awk -v t=$((after - before)) -v n="$n" -v hz="$TICKS" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        CPU[$k]="${CPU[$k]:-} $cpu"
    fi
    echo "  $target c=$conns $body: $rps req/s p50 ${p50}us p99 ${p99}us errors $err${cpu:+ cpu ${cpu}us/req}" >&2
}

# The median of a list of numbers.
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "measuring ($DURATION per cell, $ROUNDS round(s))" >&2
for body in small large; do
    for conns in 1 32; do
        # Rounds interleave the three paths, so a burst of load from elsewhere on the machine
        # falls on all of them rather than on one; each figure is the median over the rounds.
        # The two proxies swap places every round, so neither always runs right after the
        # direct path's burst or always second.
        for round in $(seq 1 "$ROUNDS"); do
            run_cell direct "http://127.0.0.1:${B[0]}/v1/chat/completions" "$conns" "$body"
            if [ $((round % 2)) -eq 1 ]; then
                run_cell nginx "$SCHEME://127.0.0.1:$NGINX_PORT/v1/chat/completions" "$conns" "$body" "$NGINX_PROXY_PID"
                run_cell kvgate "$SCHEME://127.0.0.1:$KVGATE_PORT/v1/chat/completions" "$conns" "$body" "$KVGATE_PID"
            else
                run_cell kvgate "$SCHEME://127.0.0.1:$KVGATE_PORT/v1/chat/completions" "$conns" "$body" "$KVGATE_PID"
                run_cell nginx "$SCHEME://127.0.0.1:$NGINX_PORT/v1/chat/completions" "$conns" "$body" "$NGINX_PROXY_PID"
            fi
        done
        # Each round's kvgate/nginx pair ran back to back under the same outside load.
        ROUND_RATIOS[$conns,$body]=$(paste -d' ' \
            <(tr ' ' '\n' <<<"${RPS[kvgate,$conns,$body]}" | grep .) \
            <(tr ' ' '\n' <<<"${RPS[nginx,$conns,$body]}" | grep .) |
            awk '$2 > 0 { printf "%.2f ", $1 / $2 }')
        for target in direct nginx kvgate; do
            k="$target,$conns,$body"
            RPS[$k]=$(median "${RPS[$k]}")
            P50[$k]=$(median "${P50[$k]}")
            P99[$k]=$(median "${P99[$k]}")
            [ -n "${CPU[$k]:-}" ] && CPU[$k]=$(median "${CPU[$k]}")
        done
    done
done

ms() { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }
echo
echo "kvgate overhead ($(nproc) cores, wrk $DURATION per cell, median of $ROUNDS round(s), policy $POLICY, text mode$($TLS && echo ", TLS on both proxies' listeners"))"
echo
echo "| body | conns | path | req/s | p50 ms | p99 ms | errors | proxy CPU µs/req | kvgate/nginx req/s | added p50 µs |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
for body in small large; do
    for conns in 1 32; do
        for target in direct nginx kvgate; do
            k="$target,$conns,$body"
            ratio=""
            added=""
            if [ "$target" = kvgate ]; then
                ratio=$(awk -v a="${RPS[$k]}" -v b="${RPS[nginx,$conns,$body]}" 'BEGIN { if (b > 0) printf "%.2f", a / b }')
            fi
            if [ "$target" != direct ]; then
                added=$(awk -v a="${P50[$k]}" -v b="${P50[direct,$conns,$body]}" 'BEGIN { printf "%.0f", a - b }')
            fi
            echo "| $body | $conns | $target | ${RPS[$k]} | $(ms "${P50[$k]}") | $(ms "${P99[$k]}") | ${ERR[$k]} | ${CPU[$k]:-} | $ratio | $added |"
        done
    done
done
echo
echo "kvgate/nginx req/s round by round (each pair measured back to back):"
for body in small large; do
    for conns in 1 32; do
        r=${ROUND_RATIOS[$conns,$body]}
        m=$(tr ' ' '\n' <<<"$r" | grep . | sort -g |
            awk '{ v[NR] = $1 } END { if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else if (NR) printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
        echo "- $body body, $conns connection(s): ${r}(median ${m})"
    done
done
