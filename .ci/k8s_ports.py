"""Checks that rendered manifests scrape kvgate's metrics where its config serves them.

usage: k8s_ports.py FILE...

For every rendered file with the kvgate Deployment and its `kvgate-config` ConfigMap: the port
of `server.admin_listen` (the main listener's when it is "main") is a container port of the
kvgate container, the `prometheus.io/port` annotation names it, a PodMonitor's endpoint (when
one is rendered) scrapes that container port, and the NetworkPolicy lets some ingress reach it.
Exit 0 when every file agrees with itself.
"""

import sys
import tomllib

import yaml


def check(path):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deploy = [d for d in by_kind.get("Deployment", []) if d["metadata"]["name"].endswith("kvgate")]
    config = [d for d in by_kind.get("ConfigMap", []) if d["metadata"]["name"].startswith("kvgate-config")]
    if not deploy or not config:
        return []
    errors = []
    server = tomllib.loads(config[0]["data"]["kvgate.toml"]).get("server", {})
    listen = server.get("admin_listen", "")
    if listen in ("", "main"):
        # "" in front of real instances is 127.0.0.1:9091: nothing in the cluster reaches it.
        if listen == "":
            errors.append("server.admin_listen unset: /metrics would be on 127.0.0.1:9091 only")
        listen = server.get("listen", "127.0.0.1:8080")
    port = int(listen.rsplit(":", 1)[1])
    template = deploy[0]["spec"]["template"]
    container = next(c for c in template["spec"]["containers"] if c["name"] == "kvgate")
    names = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    named = [n for n, p in names.items() if p == port]
    if not named:
        errors.append(f"no container port {port} (server.admin_listen) in {names}")
    annotation = template["metadata"].get("annotations", {}).get("prometheus.io/port")
    if annotation is not None and int(annotation) != port:
        errors.append(f"prometheus.io/port {annotation} is not the metrics port {port}")
    for pm in by_kind.get("PodMonitor", []):
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if names.get(ep.get("port")) != port:
                errors.append(f"PodMonitor scrapes port {ep.get('port')!r}, metrics are on {port}")
    for np in by_kind.get("NetworkPolicy", []):
        open_ports = {p.get("port") for rule in np["spec"].get("ingress", []) for p in rule.get("ports", [])}
        if not (open_ports & ({port} | set(named))):
            errors.append(f"NetworkPolicy {np['metadata']['name']} lets nothing reach port {port}")
    return [f"{path}: {e}" for e in errors]


def main() -> int:
    errors = [e for path in sys.argv[1:] for e in check(path)]
    for e in errors:
        print(e)
    if not errors:
        print(f"metrics port consistent in {len(sys.argv) - 1} rendered files")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
