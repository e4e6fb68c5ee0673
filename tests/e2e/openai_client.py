"""The official `openai` Python client against the kvgate binary and its embedded simulated fleet.

Started by openai_client.sh inside a venv holding `openai`. Two gateways, each in front of its own
embedded fleet:

1. healthy engines: a streamed and a plain chat completion come back whole through the client;
2. engines that drop every connection after the first token: the client's stream raises
   `openai.APIError` carrying kvgate's `upstream_stream_broken` error event (instead of hanging or
   ending as if the answer were complete), and a non-streamed request is still answered or fails
   with a clear status, never a hang;
3. HTTPS with API keys: a certificate from a test CA made here with the openssl CLI; the client
   trusts that CA (`openai.DefaultHttpxClient(verify=ca.pem)`), answers come back with the right key, a wrong
   key raises `openai.AuthenticationError`, and `curl --cacert` reaches `/health`.
"""

import os
import socket
import ssl
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


def start(drop_rate, extra="", ca=None):
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(
        f"""
[server]
listen = "127.0.0.1:{port}"
log_filter = "warn"
{extra}
[sim]
engines = 2
time_scale = 50.0

[sim.faults]
drop_rate = {drop_rate}
"""
    )
    cfg.close()
    proc = subprocess.Popen([BIN, "--config", cfg.name])
    url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=ca) if ca else None
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2, context=context) as r:
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


def answers_whole(client, how):
    """A plain and a streamed chat completion come back whole; returns the model used."""
    m = model(client)
    msgs = [{"role": "user", "content": "Say something."}]
    plain = client.chat.completions.create(model=m, messages=msgs, max_tokens=8)
    check(plain.choices[0].message.content is not None, f"plain chat answered{how}")
    chunks = list(
        client.chat.completions.create(model=m, messages=msgs, max_tokens=8, stream=True)
    )
    check(len(chunks) >= 2, f"streamed chat answered{how} in {len(chunks)} chunks")
    return m


def main():
    proc, url = start(0.0)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        answers_whole(client, "")
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


def make_certs(d):
    """A test CA and a server certificate for 127.0.0.1 signed by it; returns their paths."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in ("ca.key", "ca.pem", "key.pem", "req.csr", "cert.pem"))
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=kvgate test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext)
    return ca, cert, key


def tls_with_keys():
    d = tempfile.mkdtemp(prefix="kvgate-e2e-tls-")
    ca, cert, key = make_certs(d)
    keys = os.path.join(d, "keys.toml")
    with open(keys, "w") as f:
        f.write('[[keys]]\nkey = "sk-e2e-tenant-a-0123456789"\ntenant = "a"\n')
    extra = f"""
[server.tls]
cert_file = "{cert}"
key_file = "{key}"

[auth]
enabled = true
keys_file = "{keys}"
"""
    proc, url = start(0.0, extra=extra, ca=ca)
    try:
        # The client's own HTTP stack, told to trust the test CA.
        http = openai.DefaultHttpxClient(verify=ca)
        client = openai.OpenAI(
            base_url=url + "/v1", api_key="sk-e2e-tenant-a-0123456789",
            max_retries=0, timeout=30, http_client=http,
        )
        m = answers_whole(client, " over TLS with a key")
        msgs = [{"role": "user", "content": "Say something."}]
        wrong = openai.OpenAI(
            base_url=url + "/v1", api_key="sk-wrong-wrong-wrong-wrong",
            max_retries=0, timeout=30, http_client=http,
        )
        try:
            wrong.chat.completions.create(model=m, messages=msgs, max_tokens=8)
            check(False, "a wrong key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "a wrong key raises AuthenticationError (401)")
        out = subprocess.run(
            ["curl", "-sS", "--cacert", ca, url + "/health"], capture_output=True, text=True, timeout=30
        )
        check(out.returncode == 0 and out.stdout.strip() == "ok", f"curl --cacert reaches /health ({out.stderr.strip()})")
        untrusted = subprocess.run(["curl", "-sS", url + "/health"], capture_output=True, timeout=30)
        check(untrusted.returncode != 0, "curl without the CA refuses the certificate")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
    tls_with_keys()
