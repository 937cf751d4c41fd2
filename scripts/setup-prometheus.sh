#!/usr/bin/env bash
# Install (once) Debian's Prometheus for the monitoring tests: `prometheus` (a real server
# that scrapes a running sidecar and vLLM, evaluates the chart's dashboard queries and fires
# its alerts) and `promtool` (`check rules`, `test rules` on the chart's PrometheusRule).
# Idempotent: a second run only checks that both are on PATH. The package's service is not
# started here (the tests run their own prometheus on a free loopback port).
# Set JITSERVE_SKIP_PROMETHEUS_SETUP=1 to skip.
set -euo pipefail

if [ "${JITSERVE_SKIP_PROMETHEUS_SETUP:-0}" = "1" ]; then
  echo "setup-prometheus: skipped (JITSERVE_SKIP_PROMETHEUS_SETUP=1)"
  exit 0
fi
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  echo "setup-prometheus: $(prometheus --version 2>&1 | head -1)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
CACHE=${JITSERVE_CACHE:-$HOME/.cache/jitserve}
mkdir -p "$CACHE"
exec 9>"$CACHE/apt.lock"
flock 9
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "setup-prometheus: apt-get install prometheus"
  $SUDO apt-get update -qq
  # policy-rc.d 101: do not start the packaged service (no init system in CI containers).
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
fi
command -v prometheus >/dev/null && command -v promtool >/dev/null \
  || { echo "setup-prometheus: prometheus/promtool not on PATH after install" >&2; exit 1; }
echo "setup-prometheus: $(prometheus --version 2>&1 | head -1)"
