"""The Grafana dashboard and the alert rules against a real Prometheus scraping real gateways.

Starts a simulated fleet (`kvgate sim`, with a few injected 500s), two kvgate gateways in front of
it gossiping with each other (admission control on, tight enough that requests wait and some are
turned away), a third gateway whose pool is discovered with the `dns` source (the name
127.0.0.1, re-resolved every second, on the first engine's port: no DNS server needed) so that
the discovery panels and rules see a discovered pool, and Prometheus scraping all three every
second with the alert rules loaded. The third gateway does not gossip (its discovered instance
is named `ip:port`, not as the others name the engines) and takes a little load of its own. While
streaming chat load runs through both gateways (plus a few malformed requests and junk gossip
datagrams), it evaluates every PromQL expression of every dashboard panel through
GET /api/v1/query, Grafana variables replaced by concrete values, and fails if one errors or
returns no finite value. Then it checks that /api/v1/rules reports every rule of the rules file
loaded and healthy.

usage: prometheus_check.py KVGATE_BIN DASHBOARD_JSON RULES_YAML

Every wait has a deadline, every loop a bound; ports are chosen free at run time on 127.0.0.1.
"""

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE = time.monotonic() + 240  # the whole check
RATE_INTERVAL = "15s"  # $__rate_interval: >= 4 scrapes at 1 s
LOAD_WARMUP_S = 20  # load before the first query, so every rate window is full
SECRET = "e2e-gossip-secret-0123456789abcdef"
SYSTEM = "You are a terse assistant for the kvgate end-to-end check. " * 20

procs = []


def log(msg):
    print(msg, flush=True)


def left():
    return DEADLINE - time.monotonic()


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, argv, workdir, env=None, stdout=None):
    err = open(os.path.join(workdir, f"{name}.log"), "wb")
    p = subprocess.Popen(
        argv,
        stdout=stdout if stdout is not None else err,
        stderr=err,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    procs.append((name, p))
    return p


def stop_all():
    for _, p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def http(url, data=None, timeout=10, headers=None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait_until(what, fn, limit_s):
    end = min(time.monotonic() + limit_s, DEADLINE)
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what} (last error: {last})")


def read_line(p, limit_s):
    """The first stdout line of p, within limit_s."""
    box = []
    t = threading.Thread(target=lambda: box.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(min(limit_s, left()))
    if not box or not box[0]:
        raise SystemExit("kvgate sim printed no instance list")
    return box[0]


def port_of(url):
    return int(url.rstrip("/").rsplit(":", 1)[1])


def gateway_config(listen, admin_listen, gossip_bind, seed, instances, discovered=False):
    lines = [
        "[server]",
        f'listen = "{listen}"',
        # /metrics on a loopback admin listener of its own, as in deploy/ (there 0.0.0.0:9091).
        f'admin_listen = "{admin_listen}"',
        "shutdown_grace_ms = 2000",
        "[upstream]",
        # The fleet answers some requests 500: retry those on another instance.
        "idempotent_requests = true",
        "[admission]",
        "enabled = true",
        "max_inflight_per_instance = 1",
        "max_engine_waiting = 0",
        "max_queue_entries = 4",
        "max_wait_ms = 300",
    ]
    if gossip_bind:
        lines += [
            "[gossip]",
            "enabled = true",
            f'bind = "{gossip_bind}"',
            f'seeds = ["{seed}"]',
            'cluster_id = "e2e"',
        ]
    lines += [
        "[[pools]]",
        f'model = "{instances[0]["model"]}"',
        f'block_size = {instances[0]["block_size"]}',
        'tokenizer = "builtin"',
    ]
    if discovered:
        # The dns source resolving an address literal to the first engine (one port per dns
        # pool, so one engine).
        lines += [
            "[pools.discovery]",
            'source = "dns"',
            'name = "127.0.0.1"',
            f'port = {port_of(instances[0]["url"])}',
            "interval_ms = 1000",
        ]
        return "\n".join(lines) + "\n"
    for i in instances:
        lines += [
            "[[pools.instances]]",
            f'name = "{i["name"]}"',
            f'url = "{i["url"]}"',
            f'capacity_blocks = {i["capacity_blocks"]}',
            'kv_topic = ""',
        ]
        if i.get("kv_events_endpoint"):
            lines.append(f'kv_events = "{i["kv_events_endpoint"]}"')
        if i.get("replay_endpoint"):
            lines.append(f'kv_replay = "{i["replay_endpoint"]}"')
    return "\n".join(lines) + "\n"


class Load:
    """Streaming chat requests through both gateways until stopped (bounded by DEADLINE)."""

    def __init__(self, gateways, model, workers=8):
        self.gateways, self.model = gateways, model
        self.stop = threading.Event()
        self.counts = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True) for w in range(workers)]

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def run(self, w):
        rnd = random.Random(w)
        n = 0
        while not self.stop.is_set() and left() > 0 and n < 100_000:
            n += 1
            gw = self.gateways[n % len(self.gateways)]
            conversation = rnd.randrange(16)
            body = {
                "model": self.model,
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 8,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"conversation {conversation}: " + "tell me more. " * rnd.randrange(1, 40)},
                ],
            }
            try:
                status, _ = http(f"{gw}/v1/chat/completions", json.dumps(body).encode(), timeout=15,
                                 headers={"content-type": "application/json"})
                self.count(status)
            except urllib.error.HTTPError as e:
                self.count(e.code)
            except Exception as e:
                self.count(type(e).__name__)
            if n % 25 == 0:  # a malformed body: a gateway-side rejection (400)
                try:
                    http(f"{gw}/v1/chat/completions", b"{not json", timeout=5,
                         headers={"content-type": "application/json"})
                except urllib.error.HTTPError as e:
                    self.count(f"bad:{e.code}")
                except Exception as e:
                    self.count(type(e).__name__)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(20)


def junk_datagrams(ports):
    """Datagrams no replica can authenticate: counted in kvgate_gossip_rejected_total."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for p in ports:
            s.sendto(os.urandom(64), ("127.0.0.1", p))


def panel_queries(dashboard):
    subst = {
        "$__rate_interval": RATE_INTERVAL,
        "$__interval": "1s",
        "${pool:regex}": ".*",
        "${pool}": ".*",
        "$pool": ".*",
    }
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            if "$" in expr:
                raise SystemExit(f"panel {p['title']!r}: unreplaced Grafana variable in {expr}")
            out.append((p["title"], expr))
    return out


def query(prom, expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        _, body = http(url, timeout=10)
    except urllib.error.HTTPError as e:
        return None, f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
    r = json.loads(body)
    if r.get("status") != "success":
        return None, r.get("error", "error")
    return r["data"]["result"], None


def finite(result):
    vals = []
    for s in result:
        try:
            vals.append(float(s["value"][1]))
        except (KeyError, ValueError, TypeError):
            pass
    return [v for v in vals if math.isfinite(v)]


def main():
    kvgate, dashboard_path, rules_path = sys.argv[1:4]
    prometheus = shutil.which("prometheus")
    if not prometheus:
        raise SystemExit("prometheus not found (Debian package prometheus)")
    dashboard = json.load(open(dashboard_path))
    queries = panel_queries(dashboard)
    work = tempfile.mkdtemp(prefix="kvgate-prom-")
    try:
        sim = start("sim", [kvgate, "sim", "--engines", "4", "--time-scale", "10", "--error-rate", "0.03"],
                    work, stdout=subprocess.PIPE)
        instances = json.loads(read_line(sim, 30))
        log(f"fleet: {len(instances)} simulated engines")

        http_ports = [free_port(), free_port()]
        admin_ports = [free_port(), free_port()]
        gossip_ports = [free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)]
        gateways = []
        for i in range(2):
            cfg = os.path.join(work, f"gw{i}.toml")
            with open(cfg, "w") as f:
                f.write(gateway_config(f"127.0.0.1:{http_ports[i]}", f"127.0.0.1:{admin_ports[i]}",
                                       f"127.0.0.1:{gossip_ports[i]}",
                                       f"127.0.0.1:{gossip_ports[1 - i]}", instances))
            start(f"gw{i}", [kvgate, "--config", cfg], work, env={"KVGATE_GOSSIP_SECRET": SECRET})
            gateways.append(f"http://127.0.0.1:{http_ports[i]}")
        admins = [f"http://127.0.0.1:{p}" for p in admin_ports]
        # The third gateway: a discovered pool, no gossip.
        http_ports.append(free_port())
        admin_ports.append(free_port())
        cfg = os.path.join(work, "gw2.toml")
        with open(cfg, "w") as f:
            f.write(gateway_config(f"127.0.0.1:{http_ports[2]}", f"127.0.0.1:{admin_ports[2]}", None, None,
                                   instances, discovered=True))
        start("gw2", [kvgate, "--config", cfg], work)
        discovered = f"http://127.0.0.1:{http_ports[2]}"
        for g in gateways + [discovered]:
            wait_until(f"{g}/ready", lambda g=g: http(f"{g}/ready", timeout=2)[0] == 200, 30)
        for a in admins:
            wait_until(f"{a} gossip peer", lambda a=a: b"kvgate_gossip_peers 1" in http(f"{a}/metrics", timeout=2)[1], 30)
        log(f"gateways ready and gossiping: {gateways}")

        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        targets = "\n".join(
            f"""      - targets: ["127.0.0.1:{p}"]
        labels: {{pod: "gw-{i}", namespace: "e2e"}}""" for i, p in enumerate(admin_ports))
        pcfg = os.path.join(work, "prometheus.yml")
        with open(pcfg, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {os.path.abspath(rules_path)}
scrape_configs:
  - job_name: kvgate
    honor_labels: true
    static_configs:
{targets}
""")
        start("prometheus", [prometheus, f"--config.file={pcfg}", f"--storage.tsdb.path={work}/tsdb",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"], work)
        wait_until("prometheus ready", lambda: http(f"{prom}/-/ready", timeout=2)[0] == 200, 30)
        log(f"prometheus ready at {prom}")

        passed, failed = 0, []
        with Load(gateways, instances[0]["model"]) as load, Load([discovered], instances[0]["model"], workers=1):
            warm_end = time.monotonic() + LOAD_WARMUP_S
            while time.monotonic() < warm_end and left() > 60:
                junk_datagrams(gossip_ports)
                time.sleep(1)
            log(f"load so far: {dict(sorted(load.counts.items(), key=str))}")
            for title, expr in queries:
                if left() < 30:
                    failed.append((title, expr, "out of time"))
                    continue
                junk_datagrams(gossip_ports)
                result, err = query(prom, expr)
                if err:
                    failed.append((title, expr, err))
                elif not finite(result):
                    failed.append((title, expr, f"no data ({len(result)} series, none finite)"))
                else:
                    passed += 1
                    log(f"ok   {len(result):3} series  {title}: {expr}")
            log(f"load: {dict(sorted(load.counts.items(), key=str))}")
        for title, expr, why in failed:
            log(f"FAIL {title}: {expr}\n     {why}")

        # The rules file, loaded and evaluated without error.
        import re
        expected = len(re.findall(r"^\s*- (?:alert|record):", open(rules_path).read(), re.M))

        def rules_evaluated():
            _, body = http(f"{prom}/api/v1/rules", timeout=5)
            rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
            done = all(not r.get("lastEvaluation", "").startswith("0001") for r in rules)
            return rules if rules and done else None

        rules = wait_until("rules evaluated", rules_evaluated, 30)
        bad = [(r["name"], r.get("health"), r.get("lastError", "")) for r in rules if r.get("health") != "ok"]
        log(f"rules: {len(rules)} loaded ({expected} in {rules_path}), unhealthy: {bad}")
        if len(rules) != expected:
            failed.append(("rules", rules_path, f"{len(rules)} loaded, {expected} in the file"))
        passed += len(rules) - len(bad)
        failed += [("rule", n, f"{h}: {e}") for n, h, e in bad]
        log(f"prometheus check: {passed} passed, {len(failed)} failed")
        return 1 if failed else 0
    finally:
        stop_all()
        for name, _ in procs:
            path = os.path.join(work, f"{name}.log")
            if os.environ.get("KVGATE_E2E_KEEP_LOGS"):
                log(f"log: {path}")
        if not os.environ.get("KVGATE_E2E_KEEP_LOGS"):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
