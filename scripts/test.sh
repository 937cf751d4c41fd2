#!/usr/bin/env bash
# Install everything the tests need (idempotent; cached in .venv and, once per machine, in
# ${JITSERVE_CACHE:-~/.cache/jitserve}), then run lint, type checks and the test suite.
# CI runs exactly this. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[dev,bench,analyzer,sidecar,operator,gateway]'

# Each component's setup script is idempotent and caches its work outside the clone. They
# run at once, beside the lint and type checks: the Kubernetes build is CPU, the vLLM
# install mostly download; apt is serialised by a lock they share.
mkdir -p .setup-logs
pids=()
trap 'kill "${pids[@]%%:*}" 2>/dev/null || true' EXIT
for setup in scripts/setup-*.sh; do
  [ -e "$setup" ] || continue
  bash "$setup" >".setup-logs/$(basename "$setup").log" 2>&1 & pids+=("$!:$setup")
done
echo "== setup in the background (first time on a machine: ~20 min; logs in .setup-logs/)"
echo "== ruff"; .venv/bin/ruff check src tests scripts
echo "== mypy"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports
failed=0
for entry in "${pids[@]}"; do
  setup=${entry#*:}
  if wait "${entry%%:*}"; then
    echo "== $setup: $(tail -1 ".setup-logs/$(basename "$setup").log")"
  else
    echo "== $setup FAILED:"; cat ".setup-logs/$(basename "$setup").log"; failed=1
  fi
done
pids=()
[ "$failed" = 0 ] || exit 1

# Tests in parallel (pytest-xdist): the ones on the session's shared vLLM in one worker,
# the ones on the shared API server in another (tests/conftest.py groups them), the rest
# spread over all.
echo "== pytest"; .venv/bin/pytest -q -n "${JITSERVE_TEST_WORKERS:-3}" --dist loadgroup "$@"
