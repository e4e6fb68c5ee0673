#!/usr/bin/env bash
# The Grafana dashboard's queries and the alert rules against a real Prometheus scraping two
# release kvgate gateways (gossiping, in front of a simulated fleet) under load: every panel's
# PromQL must return data, every rule must load and evaluate healthy. Bounded to 4 minutes;
# ports chosen free at run time. Needs `prometheus` (Debian package prometheus, which .ci/run
# installs) and python3 (standard library only).
#
#   KVGATE_BIN=target/release/kvgate tests/e2e/prometheus.sh
set -euo pipefail

cd "$(dirname "$0")/../.."
KVGATE_BIN="${KVGATE_BIN:-$PWD/target/release/kvgate}"
[ -x "$KVGATE_BIN" ] || { echo "no kvgate binary at $KVGATE_BIN (cargo build --release)" >&2; exit 1; }
command -v prometheus >/dev/null || { echo "prometheus missing (Debian package prometheus)" >&2; exit 1; }

exec timeout --kill-after=10 300 python3 tests/e2e/prometheus_check.py "$KVGATE_BIN" \
    deploy/monitoring/kvgate-dashboard.json deploy/monitoring/kvgate-alerts.yaml
