#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS_PER_TARGET (default 20) from its committed
# seed corpus; exits non-zero on the first crash, panic, leak or timeout (the failing input is
# kept under fuzz/artifacts/<target>/). See docs/fuzzing.md.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"

SECS="${1:-20}"
shift || true
ALL=(h1_request_head response_head chunked_body sse_events json_reader json_route
     json_route_structured kv_events gossip_decode gossip_roundtrip config_toml k8s_watch
     usage_tokens cl100k)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL[@]}"); fi

# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer=...); the stable toolchain allows them
# under RUSTC_BOOTSTRAP=1.
export RUSTC_BOOTSTRAP=1

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kvgate-ci"
FUZZ_ROOT="$CACHE/cargo-fuzz"
# Builds go to a cache outside the checkout, so a later run (CI's fresh clone included) rebuilds
# only kvgate's own crates, not every dependency with sanitizer instrumentation.
TARGET_DIR="${KVGATE_FUZZ_TARGET_DIR:-$CACHE/fuzz-target}"
CARGO_FUZZ="$FUZZ_ROOT/bin/cargo-fuzz"
if [ ! -x "$CARGO_FUZZ" ]; then
    echo "==> installing cargo-fuzz (crates.io) into $FUZZ_ROOT"
    cargo install --quiet --locked --root "$FUZZ_ROOT" cargo-fuzz
fi
[ "${SECS}" = "--install-only" ] && exit 0

dict_for() {
    case "$1" in
        h1_request_head|response_head) echo dict/http.dict ;;
        sse_events) echo dict/sse.dict ;;
        json_reader|json_route) echo dict/json.dict ;;
        kv_events) echo dict/msgpack.dict ;;
        config_toml) echo dict/toml.dict ;;
        k8s_watch) echo dict/json.dict ;;
        usage_tokens) echo dict/usage.dict ;;
        cl100k) echo dict/cl100k.dict ;;
    esac
}

echo "==> cargo fuzz build -O (address sanitizer, debug assertions)"
start=$(date +%s)
"$CARGO_FUZZ" build -O --target-dir "$TARGET_DIR"
echo "    built in $(( $(date +%s) - start )) s"

BIN="$TARGET_DIR/x86_64-unknown-linux-gnu/release"
WORK="$TARGET_DIR/corpus"
passed=0
failed=0
for t in "${TARGETS[@]}"; do
    echo "==> $t (${SECS} s)"
    # New inputs go to a scratch copy; the committed seeds stay as they are.
    mkdir -p "$WORK/$t" "artifacts/$t"
    args=(-max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="artifacts/$t/")
    d="$(dict_for "$t")"
    [ -n "$d" ] && args+=(-dict="$d")
    log="$WORK/$t.log"
    if "$BIN/$t" "${args[@]}" "$WORK/$t" "corpus/$t" >"$log" 2>&1; then
        passed=$((passed + 1))
        { grep -aE '^#[0-9]+[[:space:]]+DONE' "$log" || true; } | tail -1 | sed "s/^/    /"
        { grep -aE '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true; } \
            | tr '\n' ' ' | sed 's/stat:://g; s/^/    /'
        echo
    else
        failed=$((failed + 1))
        echo "    FAILED: $t — last lines of $log:"
        tail -40 "$log" | sed 's/^/    /'
        ls artifacts/"$t"/ | sed 's/^/    artifact: /' || true
    fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
