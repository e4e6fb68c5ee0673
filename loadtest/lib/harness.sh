# Shared by the load-test scripts (sourced, not run): a work directory removed at exit with
# every background process the script recorded in PIDS, a free local port, and a bounded wait
# for a URL to answer.
#
#   . "$(dirname "$0")/lib/harness.sh"; harness_init callgrind

# Creates $WORK (/tmp/kvgate-NAME.XXXXXX) and arranges that the processes in PIDS are killed and
# $WORK removed when the script exits.
harness_init() { # name
    WORK=$(mktemp -d "/tmp/kvgate-$1.XXXXXX")
    PIDS=()
    trap harness_cleanup EXIT
}

harness_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}

# A TCP port free on 127.0.0.1 now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Waits (bounded) until a URL answers 200.
wait_ready() { # url seconds
    local deadline=$((SECONDS + $2))
    until curl -fsS -m 2 "$1" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "$1 not ready after $2 s" >&2; return 1; }
        sleep 0.2
    done
}
