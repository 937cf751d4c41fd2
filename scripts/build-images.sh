#!/usr/bin/env bash
# Build the three images the chart runs (operator, sidecar, analyzer), tagged with the
# package version, which is the chart's appVersion (tests/operator/test_images.py):
#   scripts/build-images.sh [--registry REGISTRY] [--push] [--print]
# --registry: the images' prefix (default jitserve; set the chart's image.repository,
# sidecarImage.repository and analyzerImage.repository to match); --push: push each
# after building; --print: print the commands instead of running them. Uses podman when
# installed, else docker (JITSERVE_IMAGE_TOOL overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
registry=jitserve push=0 print=0
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) [ $# -ge 2 ] || { echo "build-images: --registry needs a value" >&2; exit 2; }
                registry=${2%/}; shift 2 ;;
    --push) push=1; shift ;;
    --print) print=1; shift ;;
    -h|--help) sed -n 2,8p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
tool=${JITSERVE_IMAGE_TOOL:-$(command -v podman || command -v docker || true)}
if [ -z "$tool" ]; then
  [ "$print" = 1 ] && tool=podman || { echo "build-images: neither podman nor docker is installed" >&2; exit 2; }
fi
run() { if [ "$print" = 1 ]; then echo "$*"; else "$@"; fi; }
for component in operator sidecar analyzer; do
  image="$registry/$component:$version"
  run "$tool" build -f "$component/Containerfile" -t "$image" .
  if [ "$push" = 1 ]; then run "$tool" push "$image"; fi
done
