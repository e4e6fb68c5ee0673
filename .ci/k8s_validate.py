"""Validates rendered Kubernetes manifests against the API schemas of one Kubernetes version.

usage: k8s_validate.py VERSION FILE...

Strict: a field the schema does not know fails. Kinds defined by CRDs have no built-in schema
and are skipped by name (SKIP), with a line saying so; any other missing schema fails.
Exit 0 when every object is valid.
"""

import sys

import kubernetes_validate
import yaml

# CRD kinds that kvgate's manifests use, by (apiVersion group, kind).
SKIP = {
    ("monitoring.coreos.com", "PodMonitor"),
    ("monitoring.coreos.com", "ServiceMonitor"),
    ("monitoring.coreos.com", "PrometheusRule"),
    ("inference.networking.k8s.io", "InferencePool"),
    ("gateway.networking.k8s.io", "Gateway"),
    ("gateway.networking.k8s.io", "HTTPRoute"),
}


def main() -> int:
    version, files = sys.argv[1], sys.argv[2:]
    failures = checked = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            print(f"{path}: no objects")
            failures += 1
        for doc in docs:
            kind = doc.get("kind", "?")
            api = doc.get("apiVersion", "")
            group = api.split("/")[0] if "/" in api else ""
            name = f"{path}: {kind}/{doc.get('metadata', {}).get('name', '?')}"
            if (group, kind) in SKIP:
                print(f"{name}: skipped (CRD kind {api} {kind}, no built-in schema)")
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                checked += 1
            except kubernetes_validate.ValidationError as e:
                path_s = ".".join(str(p) for p in e.path)
                print(f"{name}: INVALID at {path_s or '(root)'}: {e.message}")
                failures += 1
            except kubernetes_validate.SchemaNotFoundError as e:
                print(f"{name}: no schema: {e}")
                failures += 1
    print(f"{checked} objects valid against Kubernetes {version}, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
