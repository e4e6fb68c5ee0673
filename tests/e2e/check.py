"""Real-engine test of kvgate's KV event ingestion against vLLM on CPU.

Started by vllm.sh inside the vLLM venv. Starts vLLM (tiny model, prefix caching, KV events over
ZMQ with replay) and kvgate in token mode in front of it, records vLLM's event stream with an
independent ZMQ subscriber, and checks with numbers:

1. after a request, kvgate's index holds exactly the blocks vLLM announced (event-sourced
   entries == blocks vLLM announced and still holds; every stored block re-hashed, none orphaned);
2. a second request sharing a prefix is credited by kvgate with as many blocks as vLLM's
   `vllm:prefix_cache_hits_total` grows by (kvgate hashes the request itself, so equal counts
   prove the re-hashed event blocks sit under kvgate's own hashes);
3. with a 48-block cache forced to evict, removals reach the index (entries still equal);
4. after vLLM restarts (sequence back to 0, no AllBlocksCleared), kvgate stops crediting the old
   blocks;
5. chat through kvgate with the official `openai` client, streaming and not, and chat requests
   credited in token mode (tokenizer.json + chat template) as vLLM reports;
6. tenant cache isolation: a second kvgate with API keys, tenant `a` isolated (`cache_salt` set
   on its requests) and its admin surface on a separate listener (`server.admin_listen`; the
   main listener answers `/admin/*` 404). Tenant a's repeat of a long prompt gets cached tokens
   from vLLM and the same match from kvgate, from vLLM's events of the salted chain alone;
   tenant b sending the same prompt gets 0 cached tokens from vLLM and no matched block from
   kvgate (its decision log and `x-kvgate-matched-blocks`); b's own repeat hits its own cache.
   kvgate's event-sourced entries equal vLLM's live blocks after each request. TTFTs of the
   four streamed requests are printed.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import msgspec
import zmq

BLOCK = 32
MODEL = "tiny"
TTL_MS = 500  # kvgate's prediction TTL: after it, credits come from events only


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def http_json(url, body=None, headers=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def http_text(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_until(what, fn, timeout=30.0, every=0.2):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # the service may still be starting
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
    log(f"ok: {msg}")


class Recorder(threading.Thread):
    """An independent subscriber: which blocks vLLM announced and still holds."""

    def __init__(self, endpoint):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.live = {}  # engine hash -> copies
        self.stored = 0
        self.removed = 0
        self.last_seq = None
        self.restarts = 0
        self.ready = threading.Event()

    def run(self):
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        self.ready.set()
        while True:
            topic, seq, payload = sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            batch = msgspec.msgpack.decode(payload)
            with self.lock:
                if self.last_seq is not None and seq <= self.last_seq:
                    self.restarts += 1
                    self.live.clear()
                self.last_seq = seq
                for ev in batch[1]:
                    kind = ev["type"] if isinstance(ev, dict) else ev[0]
                    hashes = ev["block_hashes"] if isinstance(ev, dict) else ev[1]
                    if kind == "BlockStored":
                        for h in hashes:
                            self.live[h] = self.live.get(h, 0) + 1
                            self.stored += 1
                    elif kind == "BlockRemoved":
                        for h in hashes:
                            if self.live.get(h, 0) > 0:
                                self.live[h] -= 1
                                self.removed += 1
                                if self.live[h] == 0:
                                    del self.live[h]
                    elif kind == "AllBlocksCleared":
                        self.live.clear()

    def snapshot(self):
        with self.lock:
            return {"live": len(self.live), "stored": self.stored, "removed": self.removed,
                    "restarts": self.restarts, "last_seq": self.last_seq}


class World:
    def __init__(self, args):
        self.args = args
        self.work = args.workdir
        self.vllm_port = free_port()
        self.pub_port = free_port()
        self.replay_port = free_port()
        self.kvgate_port = free_port()
        self.vllm = None
        self.kvgate = None
        self.vllm_url = f"http://127.0.0.1:{self.vllm_port}"
        self.kvgate_url = f"http://127.0.0.1:{self.kvgate_port}"
        # Where /admin/* is served: the main listener (asked for with `admin_listen = "main"`;
        # in front of real instances the default is 127.0.0.1:9091), until phase 6 moves it.
        self.admin_url = self.kvgate_url
        self.rid = 0

    # --- processes -------------------------------------------------------------------------
    def start_vllm(self):
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{self.pub_port}",
                  "replay_endpoint": f"tcp://*:{self.replay_port}", "topic": ""}
        cmd = [os.path.join(self.args.venv_bin, "vllm"), "serve", self.args.model_dir,
               "--served-model-name", MODEL, "--port", str(self.vllm_port), "--host", "127.0.0.1",
               "--block-size", str(BLOCK), "--max-model-len", "1024",
               "--num-gpu-blocks-override", "48", "--enable-prefix-caching",
               "--enable-prompt-tokens-details", "--kv-events-config", json.dumps(events)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_TARGET_DEVICE="cpu")
        logf = open(os.path.join(self.work, "vllm.log"), "a")
        log(f"starting vLLM on :{self.vllm_port} (events :{self.pub_port}, replay :{self.replay_port})")
        self.vllm = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_until("vLLM health", lambda: self.vllm.poll() is None and
                   urllib.request.urlopen(self.vllm_url + "/health", timeout=5).status == 200,
                   timeout=600, every=2)
        log("vLLM healthy")

    def stop_vllm(self):
        if self.vllm and self.vllm.poll() is None:
            os.killpg(self.vllm.pid, signal.SIGTERM)
            try:
                self.vllm.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.vllm.pid, signal.SIGKILL)
                self.vllm.wait()

    def start_kvgate(self, extra_server='admin_listen = "main"', extra="", ttl_ms=TTL_MS):
        d = self.args.model_dir
        cfg = f"""
[server]
listen = "127.0.0.1:{self.kvgate_port}"
{extra_server}

[routing]
hash_mode = "token"
predicted_ttl_ms = {ttl_ms}

[events]
replay_timeout_ms = 5000
{extra}

[[pools]]
model = "{MODEL}"
block_size = {BLOCK}
tokenizer = "{d}/tokenizer.json"
chat_template = "{d}/chat_template.jinja"

[[pools.instances]]
name = "vllm-0"
url = "{self.vllm_url}"
kv_events = "tcp://127.0.0.1:{self.pub_port}"
kv_replay = "tcp://127.0.0.1:{self.replay_port}"
"""
        path = os.path.join(self.work, "kvgate.toml")
        with open(path, "w") as f:
            f.write(cfg)
        logf = open(os.path.join(self.work, "kvgate.log"), "a")
        log(f"starting kvgate on :{self.kvgate_port}")
        self.kvgate = subprocess.Popen([self.args.kvgate_bin, "--config", path], stdout=logf,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=dict(os.environ, KVGATE_LOG="info"))
        wait_until("kvgate ready", lambda: self.kvgate.poll() is None and
                   urllib.request.urlopen(self.kvgate_url + "/ready", timeout=5).status == 200,
                   timeout=60)
        wait_until("kvgate events connected",
                   lambda: all(s.get("connected") for s in self.kvgate_events()), timeout=30)

    def stop_kvgate(self):
        if self.kvgate and self.kvgate.poll() is None:
            os.killpg(self.kvgate.pid, signal.SIGTERM)
            self.kvgate.wait(30)

    def stop_all(self):
        self.stop_kvgate()
        self.stop_vllm()

    # --- observations ----------------------------------------------------------------------
    def kvgate_index(self):
        return http_json(self.admin_url + "/admin/index")

    def kvgate_events(self):
        ev = self.kvgate_index().get("events")
        if not ev:
            raise AssertionError("/admin/index has no `events` section: KV events not wired")
        return ev

    def kvgate_event_entries(self):
        return self.kvgate_index()["stats"]["entries_by_source"][0]

    def vllm_hits(self):
        text = http_text(self.vllm_url + "/metrics")
        total = 0.0
        for line in text.splitlines():
            if re.match(r"^vllm:prefix_cache_hits(_total)?\{", line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def decision(self, rid):
        for d in reversed(http_json(self.admin_url + "/admin/decisions")["decisions"]):
            if d["request_id"] == rid:
                return d
        raise AssertionError(f"no decision logged for {rid}")

    # --- requests --------------------------------------------------------------------------
    def complete(self, tokens, max_tokens=2):
        self.rid += 1
        rid = f"e2e-{self.rid}"
        body = {"model": MODEL, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0}
        r = http_json(self.kvgate_url + "/v1/completions", body, {"x-request-id": rid}, timeout=120)
        return rid, r

    def stream_complete(self, tokens, key, max_tokens=2):
        """A streamed completion through kvgate with API key `key`: (request id, seconds to the
        first token, the final usage, kvgate's `x-kvgate-matched-blocks`)."""
        self.rid += 1
        rid = f"e2e-{self.rid}"
        body = json.dumps({"model": MODEL, "prompt": tokens, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        conn = http.client.HTTPConnection("127.0.0.1", self.kvgate_port, timeout=120)
        started = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body,
                     headers={"content-type": "application/json", "x-request-id": rid,
                              "authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise AssertionError(f"{rid}: status {resp.status}: {resp.read()[:300]!r}")
        matched = int(resp.getheader("x-kvgate-matched-blocks", "-1"))
        ttft, usage = None, None
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            # The first token's chunk (its text may be empty: a partial UTF-8 sequence).
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                usage = chunk["usage"]
        conn.close()
        if usage is None:
            raise AssertionError(f"{rid}: no usage in the stream")
        return rid, ttft, usage, matched

    def chat(self, messages, max_tokens=2):
        self.rid += 1
        rid = f"e2e-{self.rid}"
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        r = http_json(self.kvgate_url + "/v1/chat/completions", body, {"x-request-id": rid}, timeout=120)
        return rid, r


def tokens(rng, n):
    return [rng.randrange(3, 4096) for _ in range(n)]


def settle(w, rec, what):
    """Waits until kvgate's event-sourced entries equal what vLLM announced and holds."""
    def same():
        live = rec.snapshot()["live"]
        return live if w.kvgate_event_entries() == live else None
    try:
        wait_until(what, same, timeout=20)
    except AssertionError:
        pass
    snap = rec.snapshot()
    mine = w.kvgate_event_entries()
    check(mine == snap["live"], f"{what}: kvgate holds {mine} event-sourced blocks, vLLM announced {snap['live']} live")
    return snap


def credited(w, rid):
    return w.decision(rid)["decision"]["matched_blocks"]


def run(args):
    rng = random.Random(7)
    w = World(args)
    try:
        w.start_vllm()
        rec = Recorder(f"tcp://127.0.0.1:{w.pub_port}")
        rec.start()
        rec.ready.wait(10)
        time.sleep(0.5)
        w.start_kvgate()

        # 1. One request: the index holds exactly what vLLM announced.
        a = tokens(rng, 300)
        rid, r = w.complete(a)
        snap = settle(w, rec, "1. after one request")
        check(snap["live"] == (300 + 2) // BLOCK, f"1. vLLM announced {snap['live']} full blocks of the 302-token sequence")
        st = w.kvgate_events()[0]
        check(st["orphan_blocks"] == 0 and st["block_size_mismatch"] is None,
              f"1. every announced block re-hashed (orphans {st['orphan_blocks']}, mismatch {st['block_size_mismatch']})")

        # 2. A request sharing a prefix: kvgate's credit == vLLM's prefix cache hits.
        time.sleep(2 * TTL_MS / 1000)
        b = a[:200] + tokens(rng, 100)
        hits0 = w.vllm_hits()
        rid, r = w.complete(b)
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        hits = wait_until("vLLM hit counter", lambda: (w.vllm_hits() - hits0) or None, timeout=10)
        mine = credited(w, rid)
        check(hits == cached == 192, f"2. vLLM: {hits:.0f} prefix-cache hit tokens, cached_tokens {cached}")
        check(mine * BLOCK == hits, f"2. kvgate credited {mine} blocks = {mine * BLOCK} tokens")
        settle(w, rec, "2. after the shared-prefix request")

        # 3. Evictions: a 48-block cache, prompts of ~19 blocks each.
        for _ in range(5):
            w.complete(tokens(rng, 600))
        snap = settle(w, rec, "3. after evictions")
        st = w.kvgate_events()[0]
        check(snap["removed"] > 0, f"3. vLLM announced {snap['removed']} removals")
        check(st["blocks_removed"] == snap["removed"], f"3. kvgate applied {st['blocks_removed']} removals")

        # 4. Restart: the old blocks must stop being credited.
        d = tokens(rng, 320)
        w.complete(d)
        settle(w, rec, "4. before restart")
        time.sleep(2 * TTL_MS / 1000)
        rid, _ = w.complete(d)
        before = credited(w, rid)
        check(before >= 9, f"4. before the restart kvgate credits {before} blocks of a cached prompt")
        log("restarting vLLM")
        w.stop_vllm()
        w.start_vllm()
        restarts0 = w.kvgate_events()[0]["restarts"]

        def detected():
            w.complete(tokens(rng, 70))
            return w.kvgate_events()[0]["restarts"] > restarts0
        wait_until("kvgate detecting the restart", detected, timeout=90, every=3)
        time.sleep(2 * TTL_MS / 1000)
        rid, r = w.complete(d)
        after = credited(w, rid)
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        check(cached == 0, "4. the restarted vLLM had nothing cached for the old prompt")
        check(after == 0, f"4. after the restart kvgate credits {after} blocks (was {before})")
        settle(w, rec, "4. after restart")

        # 5. Chat through kvgate with the openai client; token-mode credit for chat.
        from openai import OpenAI
        client = OpenAI(base_url=w.kvgate_url + "/v1", api_key="unused")
        messages = [{"role": "system", "content": "You are a careful assistant. " * 40},
                    {"role": "user", "content": "Say something."}]
        resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        check(isinstance(resp.choices[0].message.content, str) and resp.usage.prompt_tokens > 0,
              f"5. non-streaming chat: {resp.usage.prompt_tokens} prompt tokens")
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(len(chunks) >= 2 and chunks[-1].usage is not None,
              f"5. streaming chat: {len(chunks)} chunks, {len(text)} chars, usage in the last chunk")
        time.sleep(2 * TTL_MS / 1000)
        messages[1]["content"] = "Say something else."
        rid, r = w.chat(messages)
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        mine = credited(w, rid)
        check(cached > 0 and mine * BLOCK == cached,
              f"5. chat in token mode: kvgate credited {mine} blocks, vLLM cached {cached} tokens")

        # 6. Tenant cache isolation on the real engine, admin surface on its own listener.
        phase6(w, rec, rng)
        log("all checks passed")
    finally:
        w.stop_all()


def phase6(w, rec, rng):
    keys = os.path.join(w.work, "keys.toml")
    with open(keys, "w") as f:
        f.write('[[tenants]]\nname = "a"\ncache = "isolated"\n\n'
                '[[keys]]\nkey = "e2e-key-of-tenant-a"\ntenant = "a"\n\n'
                '[[keys]]\nkey = "e2e-key-of-tenant-b"\ntenant = "b"\n')
    admin_port = free_port()
    w.stop_kvgate()
    w.admin_url = f"http://127.0.0.1:{admin_port}"
    w.start_kvgate(extra_server=f'admin_listen = "127.0.0.1:{admin_port}"',
                   extra=f'\n[auth]\nenabled = true\nkeys_file = "{keys}"\n')
    try:
        http_text(w.kvgate_url + "/admin/decisions")
        raise AssertionError("6. /admin/decisions answered on the main listener")
    except urllib.error.HTTPError as e:
        check(e.code == 404, f"6. the main listener answers /admin/decisions {e.code}")
    check(http_text(w.admin_url + "/health") == "ok", "6. /health on the admin listener")

    prompt = tokens(rng, 600)
    full = (len(prompt) // BLOCK) * BLOCK
    runs = []

    def ask(name, key):
        r = w.stream_complete(prompt, key)
        runs.append((name, r))
        # Each repeat is credited by the KV events alone: kvgate's own prediction has expired.
        settle(w, rec, f"6. after {name}")
        time.sleep(2 * TTL_MS / 1000)
        return r

    ask("a first", "e2e-key-of-tenant-a")
    ask("a repeat", "e2e-key-of-tenant-a")
    ask("b first", "e2e-key-of-tenant-b")
    ask("b repeat", "e2e-key-of-tenant-b")
    rows = []
    for name, (rid, ttft, usage, matched) in runs:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        logged = credited(w, rid)
        rows.append((cached, matched, logged))
        log(f"6. {name:9} prompt {usage['prompt_tokens']} tokens, vLLM cached_tokens {cached}, "
            f"kvgate matched blocks {matched} (decision log {logged}), TTFT {ttft * 1000:.1f} ms")
    (a1c, a1m, _), (a2c, a2m, a2l), (b1c, b1m, b1l), (b2c, b2m, _) = rows
    check(a1c == 0 and a1m == 0, "6. tenant a's first request is cold")
    check(a2c >= full - BLOCK and a2m * BLOCK == a2c and a2l == a2m,
          f"6. tenant a's repeat hits: {a2c} cached tokens, kvgate matched {a2m} blocks (from events)")
    check(b1c == 0, f"6. tenant b sending a's prompt gets {b1c} cached tokens from vLLM")
    check(b1m == 0 and b1l == 0, f"6. kvgate credited tenant b with {b1m} blocks (decision log {b1l})")
    check(b2c >= full - BLOCK and b2m * BLOCK == b2c,
          f"6. tenant b's own repeat hits its own cache: {b2c} cached tokens, kvgate matched {b2m} blocks")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--venv-bin", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--kvgate-bin", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    try:
        run(args)
    except AssertionError as e:
        log(f"FAILED: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
