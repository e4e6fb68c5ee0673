"""The official `openai` Python client against the kvgate binary and its embedded simulated fleet.

Started by openai_client.sh inside a venv holding `openai`. Two gateways, each in front of its own
embedded fleet:

1. healthy engines: a streamed and a plain chat completion come back whole through the client;
2. engines that drop every connection after the first token: the client's stream raises
   `openai.APIError` carrying kvgate's `upstream_stream_broken` error event (instead of hanging or
   ending as if the answer were complete), and a non-streamed request is still answered or fails
   with a clear status, never a hang.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

BIN = os.environ["KVGATE_BIN"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(cond, msg):
    if not cond:
        print(f"FAILED: {msg}", flush=True)
        sys.exit(1)
    print(f"ok: {msg}", flush=True)


def start(drop_rate):
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(
        f"""
[server]
listen = "127.0.0.1:{port}"
log_filter = "warn"

[sim]
engines = 2
time_scale = 50.0

[sim.faults]
drop_rate = {drop_rate}
"""
    )
    cfg.close()
    proc = subprocess.Popen([BIN, "--config", cfg.name])
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            check(False, f"kvgate exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    check(False, "kvgate ready within 60 s")


def model(client):
    return client.models.list().data[0].id


def main():
    proc, url = start(0.0)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        m = model(client)
        msgs = [{"role": "user", "content": "Say something."}]
        plain = client.chat.completions.create(model=m, messages=msgs, max_tokens=8)
        check(plain.choices[0].message.content is not None, "plain chat answered")
        chunks = list(
            client.chat.completions.create(model=m, messages=msgs, max_tokens=8, stream=True)
        )
        check(len(chunks) >= 2, f"streamed chat answered in {len(chunks)} chunks")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    proc, url = start(1.0)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        m = model(client)
        msgs = [{"role": "user", "content": "Say something long."}]
        raised = None
        got = 0
        try:
            for _ in client.chat.completions.create(
                model=m, messages=msgs, max_tokens=64, stream=True
            ):
                got += 1
        except openai.APIError as e:
            raised = e
        check(raised is not None, f"a stream the engine broke raises APIError (after {got} chunks)")
        body = getattr(raised, "body", None) or {}
        code = body.get("code") if isinstance(body, dict) else None
        check(code == "upstream_stream_broken", f"the error names the broken stream ({raised!r})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
