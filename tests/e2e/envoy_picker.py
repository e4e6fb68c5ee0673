"""Envoy with kvgate as its endpoint picker (ext_proc), end to end.

Started by envoy_picker.sh. kvgate runs its embedded simulated fleet with `[picker]` on; Envoy
listens for clients, sends each request through its ext_proc filter to kvgate
(FULL_DUPLEX_STREAMED request and response bodies, as GIE requires) and proxies it to the
endpoint kvgate names in `x-gateway-destination-endpoint`, through an ORIGINAL_DST cluster that
reads that header (GIE's e2e Envoy configuration). Checks:

1. a plain and a streamed chat completion come back whole through Envoy;
2. every request through Envoy is a decision in kvgate's /admin/decisions (by request id), on an
   engine of the fleet, and its load is released once the answer is complete;
3. a prompt repeated through Envoy lands on the engine that holds its prefix;
4. a body over kvgate's limit is answered 413 by Envoy on kvgate's behalf;
5. with the picker stopped, Envoy (failure_mode_allow false) fails the request.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN = os.environ["KVGATE_BIN"]
ENVOY = os.environ["ENVOY_BIN"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(cond, msg):
    if not cond:
        print(f"FAILED: {msg}", flush=True)
        sys.exit(1)
    print(f"ok: {msg}", flush=True)


def wait_http(url, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            check(False, f"{what} exited with {proc.returncode}")
        time.sleep(0.2)
    check(False, f"{what} ready within {timeout} s")


ENVOY_CONFIG = """
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
    - name: inference
      address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: inference
                route_config:
                  name: inference
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          route: {{cluster: original_destination_cluster, timeout: 120s}}
                http_filters:
                  - name: envoy.filters.http.ext_proc
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
                      grpc_service:
                        envoy_grpc: {{cluster_name: ext_proc}}
                        timeout: 10s
                      failure_mode_allow: false
                      processing_mode:
                        request_header_mode: SEND
                        response_header_mode: SEND
                        request_body_mode: FULL_DUPLEX_STREAMED
                        response_body_mode: FULL_DUPLEX_STREAMED
                        request_trailer_mode: SEND
                        response_trailer_mode: SEND
                      message_timeout: 60s
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                      suppress_envoy_headers: true
  clusters:
    - name: original_destination_cluster
      type: ORIGINAL_DST
      connect_timeout: 5s
      lb_policy: CLUSTER_PROVIDED
      original_dst_lb_config:
        use_http_header: true
        http_header_name: x-gateway-destination-endpoint
    - name: ext_proc
      type: STATIC
      connect_timeout: 5s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
      load_assignment:
        cluster_name: ext_proc
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address: {{socket_address: {{address: 127.0.0.1, port_value: {picker}}}}}
"""


def post(url, body, rid, stream=False):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-request-id": rid},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()


def main():
    http, picker, listen, admin = free_port(), free_port(), free_port(), free_port()
    tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, "kvgate.toml")
    with open(cfg, "w") as f:
        f.write(
            f"""
[server]
listen = "127.0.0.1:{http}"
# /admin/decisions and /admin/instances are read on this listener.
admin_listen = "main"
log_filter = "warn"
body_limit_bytes = 200000

[picker]
enabled = true
listen = "127.0.0.1:{picker}"
# A plain Envoy's ORIGINAL_DST cluster reads one address from the header.
fallbacks = 0

[sim]
engines = 3
time_scale = 50.0
"""
        )
    kv = subprocess.Popen([BIN, "--config", cfg], stdout=subprocess.DEVNULL)
    env = None
    try:
        gw = f"http://127.0.0.1:{http}"
        wait_http(gw + "/ready", kv, "kvgate")
        with open(os.path.join(tmp, "envoy.yaml"), "w") as f:
            f.write(ENVOY_CONFIG.format(admin=admin, listen=listen, picker=picker))
        env = subprocess.Popen(
            [ENVOY, "-c", os.path.join(tmp, "envoy.yaml"), "--log-level", "warn",
             "--base-id", str(listen)],
        )
        wait_http(f"http://127.0.0.1:{admin}/ready", env, "envoy")
        models = json.loads(urllib.request.urlopen(gw + "/v1/models").read())
        model = models["data"][0]["id"]
        front = f"http://127.0.0.1:{listen}/v1/chat/completions"
        prompt = " ".join(f"word{i}" for i in range(2000))
        msgs = [{"role": "user", "content": prompt}]

        status, body = post(front, {"model": model, "messages": msgs, "max_tokens": 8}, "e2e-1")
        answer = json.loads(body)
        check(status == 200 and answer["choices"][0]["message"]["content"],
              "a plain chat completion through Envoy")
        status, body = post(
            front,
            {"model": model, "messages": msgs, "max_tokens": 8, "stream": True},
            "e2e-2",
        )
        text = body.decode()
        check(status == 200 and "data: [DONE]" in text and text.count("data: ") >= 3,
              "a streamed chat completion through Envoy, whole")

        decisions = json.loads(urllib.request.urlopen(gw + "/admin/decisions").read())
        recs = decisions if isinstance(decisions, list) else decisions.get("decisions", [])
        by_id = {r["request_id"]: r for r in recs}
        check("e2e-1" in by_id and "e2e-2" in by_id,
              "both requests are kvgate decisions in /admin/decisions")
        check(by_id["e2e-1"]["chosen"] == by_id["e2e-2"]["chosen"],
              f"the repeated prompt stays where its prefix is ({by_id['e2e-1']['chosen']})")
        check(by_id["e2e-2"]["decision"]["matched_blocks"] > 0,
              "the second request matched the first one's blocks")

        for _ in range(50):
            inst = json.loads(urllib.request.urlopen(gw + "/admin/instances").read())
            rows = inst if isinstance(inst, list) else inst.get("instances", [])
            if all(r["in_flight"] == 0 for r in rows):
                break
            time.sleep(0.1)
        check(all(r["in_flight"] == 0 for r in rows),
              "load released once the answers were complete")

        big = {"model": model, "messages": [{"role": "user", "content": "x" * 300000}]}
        try:
            post(front, big, "e2e-3")
            check(False, "a body over the limit is refused")
        except urllib.error.HTTPError as e:
            check(e.code == 413, f"a body over kvgate's limit is answered 413 (got {e.code})")

        kv.terminate()
        kv.wait(timeout=60)
        try:
            post(front, {"model": model, "messages": msgs}, "e2e-4")
            check(False, "with the picker gone the request fails")
        except urllib.error.HTTPError as e:
            check(e.code >= 500, f"with the picker gone Envoy fails closed ({e.code})")
        except OSError as e:
            check(True, f"with the picker gone the request fails ({e})")
    finally:
        for p in (env, kv):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
