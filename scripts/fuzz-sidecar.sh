#!/usr/bin/env bash
# Owner: sidecar. The fuzz suite at full size: 2,500 hypothesis cases per test (10,000 in
# all) against a sidecar process in front of the fake vLLM; prints how many ran. The
# always-on run in scripts/test.sh does 250 per test. Usage: scripts/fuzz-sidecar.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2500}
REPORT=$(mktemp)
trap 'rm -f "$REPORT"' EXIT
JITSERVE_FUZZ_EXAMPLES=$N JITSERVE_FUZZ_REPORT=$REPORT \
  .venv/bin/pytest -q -p no:cacheprovider tests/sidecar/test_sidecar_fuzz.py
cat "$REPORT"
