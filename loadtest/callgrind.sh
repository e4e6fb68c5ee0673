#!/usr/bin/env bash
# Counts the user-space instructions kvgate spends per proxied request, under callgrind.
#
# Instruction counts do not move with other load on the machine, so this is the figure to compare
# two builds by on a shared machine (wall-clock throughput is what loadtest/overhead.sh measures).
# Set-up, all on 127.0.0.1 free ports: the same upstream as overhead.sh (one nginx with 2 workers
# serving 4 static backends that answer a fixed small chat completion), and the release kvgate
# (text-mode hashing) in front of them under `valgrind --tool=callgrind --dump-instr=no`.
# For each policy a fresh gateway starts; for each body (a small chat request, a ~32 KiB one) a
# client outside valgrind opens one keep-alive connection, sends $WARM requests, zeroes the
# counters (`callgrind_control -z`, so start-up, connection set-up and the first requests' lazy
# initialisation are excluded), sends exactly $N requests one after another (each must answer
# 200), then dumps the counters. Instructions per request = the dump's total / $N. The total also
# holds what the gateway's background tasks (timers, health, metrics) ran during the window; it
# does not grow with requests and is small against $N requests (compare runs with the same $N).
#
# Run to run, the small body's count moves by ~2 % (same binary, 2026-12-03: 30.0k–30.6k): how
# often a task wakes to find nothing to read depends on timing between the processes, and each
# such wake-up is a `recv` and an `epoll_wait` more (the table's recv/req and epoll_wait/req show
# it; those calls' kernel time is not counted). Compare builds by medians over a few runs
# (`--bodies small` keeps a run short) and read the per-function figures for what moved.
#
# Usage: loadtest/callgrind.sh [--requests 2000] [--warm 200] [--policies "round_robin kvgate"]
#                              [--bodies "small large"] [--hash-mode text|token] [--bin PATH]
#                              [--unique] [--token-cache] [--out DIR]
# --unique: each request's prompt starts with its own number, so no two share a first block
# (unrelated prompts: nothing matches in the index, every block is new to it, no cache hits).
# --token-cache: token mode keeps the tokenizer's prefix cache at its default size (with
# --unique every request then pays its insertion), instead of turning it off.
# Bodies: small (a short chat request), large (~32 KiB of text, ~8K cl100k tokens), xlarge
# (~400 KiB, ~100K tokens, every sentence distinct). --hash-mode token hashes with the built-in
# tokenizer (its prefix cache off, so every request is an unrelated prompt's cost); token-mode
# cells are slow under valgrind (use e.g. --requests 20 --warm 5).
# KVGATE_BIN=PATH works as --bin (an already built kvgate; otherwise the release one is built).
# Prints a Markdown table; writes each cell's callgrind dump and its top functions
# (own cost, see top.py below) to DIR (default loadtest/results/callgrind, kept after the run).
# Needs: valgrind (callgrind_control), nginx (installed from Debian when
# missing, as root), python3, curl, cargo.
set -euo pipefail

N=2000
WARM=200
POLICIES="round_robin kvgate"
BODIES="small large"
HASH_MODE=text
BIN="${KVGATE_BIN:-}"
OUT=""
UNIQUE=false
TOKEN_CACHE=false
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) N="$2"; shift 2 ;;
        --warm) WARM="$2"; shift 2 ;;
        --policies) POLICIES="$2"; shift 2 ;;
        --bodies) BODIES="$2"; shift 2 ;;
        --hash-mode) HASH_MODE="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --unique) UNIQUE=true; shift ;;
        --token-cache) TOKEN_CACHE=true; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT="${OUT:-$ROOT/loadtest/results/callgrind}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in valgrind callgrind_control python3 curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "needs $tool" >&2; exit 2; }
done
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "installing nginx-light from Debian" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "$BIN" ]; then
    echo "building kvgate (release)" >&2
    cargo build --release --bin kvgate -q
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/kvgate"
fi
[ -x "$BIN" ] || { echo "no kvgate binary at $BIN" >&2; exit 2; }

# shellcheck source=lib/harness.sh
. "$ROOT/loadtest/lib/harness.sh"
harness_init callgrind

B=()
for _ in 1 2 3 4; do B+=("$(free_port)"); done

# The upstream: what overhead.sh uses, one nginx with 2 workers and 4 static backends.
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
"$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_ready "http://127.0.0.1:${B[0]}/" 20

# Request bodies: the small chat request and the ~32 KiB one of overhead.sh.
# With --unique each prompt's first message starts with a placeholder the client numbers.
python3 - "$WORK" "$UNIQUE" <<'PY'
import json, sys
work, unique = sys.argv[1], sys.argv[2] == "true"
head = "@@ID@@ " if unique else ""
small = {"model": "m", "messages": [{"role": "system", "content": head + "You are a helpful assistant."},
                                    {"role": "user", "content": "Say hello."}], "max_tokens": 16}
big_text = head + ("The quick brown fox jumps over the lazy dog. " * 800)[:32 * 1024 - 200]
large = {"model": "m", "messages": [{"role": "user", "content": big_text}], "max_tokens": 16}
huge_text = head + " ".join(f"Sentence {i} of the long prompt says something new about item {i * 7919 % 100003}."
                            for i in range(5600))
xlarge = {"model": "m", "messages": [{"role": "user", "content": huge_text}], "max_tokens": 16}
for name, body in (("small", small), ("large", large), ("xlarge", xlarge)):
    with open(f"{work}/{name}.json", "w") as f:
        f.write(json.dumps(body))
PY

# The client: one keep-alive connection, warm-up, zero, exactly N requests, dump. It runs
# outside valgrind; every request is one send (head and body together) and must answer 200.
cat >"$WORK/drive.py" <<'PY'
import http.client, subprocess, sys
port, body_file, warm, n, pid, label = sys.argv[1:7]
body = open(body_file, "rb").read()
headers = {"Content-Type": "application/json"}
conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
sent = 0

def run(count):
    global sent
    for _ in range(count):
        # Same length every time; unique when the body holds the placeholder (--unique).
        sent += 1
        one = body.replace(b"@@ID@@", b"%06d" % sent)
        conn.request("POST", "/v1/chat/completions", body=one, headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"answer {r.status}")

def control(*args):
    # Bounded: callgrind acts on the command when the gateway next runs code.
    subprocess.run(["callgrind_control", *args, pid], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

run(int(warm))
control("-z")
run(int(n))
control(f"--dump={label}")
conn.close()
PY

# Own cost by function from a dump. callgrind_annotate (3.19) books a call begun before the
# counters were zeroed (`calls=0`) as the caller's own cost, so a zeroed dump shows everything
# under `clone`; this reads the format itself: a cost line right after `calls=` is the callee's
# inclusive cost and is skipped, every other cost line is its function's own.
cat >"$WORK/top.py" <<'PY'
import collections, re, sys
names, own, calls = {}, collections.Counter(), collections.Counter()
def name(v):
    m = re.match(r"\((\d+)\)(?: (.*))?$", v)
    if not m:
        return v
    if m.group(2) is not None:
        names[m.group(1)] = m.group(2)
    return names.get(m.group(1), v)
total, fn, after_call = 0, None, False
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith(("summary:", "totals:")):
        total = int(line.split()[1])
    elif line.startswith("fn="):
        fn = name(line[3:])
    elif line.startswith(("cfn=", "cfni=")):
        callee = name(line.split("=", 1)[1])
    elif line.startswith("calls="):
        after_call = True
        calls[callee] += int(line[6:].split()[0])
    elif line[:1].isdigit() or line[:1] in ("+", "-", "*"):
        if after_call:
            after_call = False
        elif fn is not None and len(line.split()) >= 2:
            own[fn] += int(line.split()[1])
n = int(sys.argv[2])
print(f"{total} instructions, {total / n:.0f} per request over {n}; socket calls per request:"
      f" recv {calls['recv'] / n:.2f} epoll_wait {calls['epoll_wait'] / n:.2f}"
      f" send {calls['send'] / n:.2f}; own cost by function:")
for f, c in own.most_common(int(sys.argv[3])):
    print(f"{c:>12} {100 * c / max(total, 1):5.1f}% {c / n:9.0f}/req  {f}")
PY

printf '| policy | body | requests | instructions | per request | recv/req | epoll_wait/req |\n|---|---|---:|---:|---:|---:|---:|\n' >"$WORK/table"
for policy in $POLICIES; do
    PORT=$(free_port)
    {
        echo "[server]"
        echo "listen = \"127.0.0.1:$PORT\""
        # No admin listener on its default fixed port: one port per run.
        echo "admin_listen = \"main\""
        echo "log_filter = \"warn\""
        echo "[load]"
        echo "enabled = false"
        echo "[routing]"
        echo "hash_mode = \"$HASH_MODE\""
        [ "$HASH_MODE" = token ] && ! $TOKEN_CACHE && echo "tokenizer_cache_bytes = 0"
        echo "[routing.policy]"
        echo "name = \"$policy\""
        echo "[[pools]]"
        echo "model = \"m\""
        for p in "${B[@]}"; do echo "[[pools.instances]]"; echo "url = \"http://127.0.0.1:$p\""; done
    } >"$WORK/kvgate-$policy.toml"
    CG="$WORK/cg-$policy"
    mkdir -p "$CG"
    valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$CG/callgrind.out" \
        "$BIN" --config "$WORK/kvgate-$policy.toml" >"$WORK/kvgate-$policy.log" 2>&1 &
    VG=$!
    PIDS+=("$VG")
    wait_ready "http://127.0.0.1:$PORT/ready" 120
    for body in $BODIES; do
        echo "  $policy $body: $WARM warm-up + $N requests" >&2
        before=$(ls "$CG" | wc -l)
        timeout 1800 python3 "$WORK/drive.py" "$PORT" "$WORK/$body.json" "$WARM" "$N" "$VG" "$policy-$body"
        # The dump is the file that appeared (callgrind writes it before callgrind_control returns).
        dump=$(ls -t "$CG"/callgrind.out.* | head -n 1)
        [ "$(ls "$CG" | wc -l)" -gt "$before" ] || { echo "no new dump for $policy $body" >&2; exit 1; }
        total=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
        cp "$dump" "$OUT/callgrind.out.$policy-$body"
        python3 "$WORK/top.py" "$dump" "$N" 40 >"$OUT/top-$policy-$body.txt"
        per=$(awk -v t="$total" -v n="$N" 'BEGIN { printf "%.1fk", t / n / 1000 }')
        read -r recv epoll < <(sed -n '1s/.* recv \([0-9.]*\) epoll_wait \([0-9.]*\).*/\1 \2/p' \
            "$OUT/top-$policy-$body.txt")
        echo "| $policy | $body | $N | $total | $per | $recv | $epoll |" >>"$WORK/table"
        echo "  $policy $body: $per instructions per request" >&2
    done
    kill "$VG" 2>/dev/null || true
    wait "$VG" 2>/dev/null || true
done

echo
echo "kvgate user-space instructions per request (callgrind, $(basename "$BIN") $("$BIN" --version 2>/dev/null | head -n 1), 1 connection, $HASH_MODE mode)"
echo
cat "$WORK/table"
echo
echo "own cost by function per cell: $OUT/top-*.txt"
