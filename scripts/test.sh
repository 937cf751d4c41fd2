#!/usr/bin/env bash
# Install everything the tests need (idempotent; cached in .venv), start what they need,
# then run lint, type checks and the test suite. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[dev,bench,analyzer,sidecar,operator]'
# Components add their own setup here (each script is idempotent and caches its work).
for setup in scripts/setup-*.sh; do
  [ -e "$setup" ] || continue
  echo "== $setup"
  bash "$setup"
done
echo "== ruff"; .venv/bin/ruff check src tests scripts
echo "== mypy"; .venv/bin/mypy
echo "== import contracts"; .venv/bin/lint-imports
# Tests in parallel: the ones on the session's shared vLLM in one worker, the ones on the
# shared API server in another (tests/conftest.py groups them), the rest spread over all.
echo "== pytest"; .venv/bin/pytest -q -n "${JITSERVE_TEST_WORKERS:-3}" --dist loadgroup "$@"
