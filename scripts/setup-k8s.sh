#!/usr/bin/env bash
# Build (once) a real Kubernetes control plane for the operator tests: kube-apiserver,
# kube-controller-manager and kubectl 1.20.2 from Debian's `kubernetes` source package, plus
# etcd from Debian's `etcd-server`. See shared/KUBERNETES.md for the measured recipe.
#
# Idempotent. The binaries are cached OUTSIDE the clone, keyed by version:
#   ${JITSERVE_CACHE:-$HOME/.cache/jitserve}/k8s-v1.20.2-p2/bin/{kube-apiserver,kube-controller-manager,kubectl}
# ("-p2": the two source patches below; bump it when they change). Only missing binaries are
# built, so adding one to BINARIES builds just that one (same source, same patches).
# A second run on the same machine only checks that they are there (well under a second).
# Set JITSERVE_SKIP_K8S_SETUP=1 to skip (e.g. when the e2e tests use an external KUBECONFIG).
set -euo pipefail

K8S_VERSION=1.20.2
CACHE=${JITSERVE_CACHE:-$HOME/.cache/jitserve}
PATCH_LEVEL=p2
DEST="$CACHE/k8s-v$K8S_VERSION-$PATCH_LEVEL"
BIN="$DEST/bin"

if [ "${JITSERVE_SKIP_K8S_SETUP:-0}" = "1" ]; then
  echo "setup-k8s: skipped (JITSERVE_SKIP_K8S_SETUP=1)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

start=$(date +%s)
# Helm (its Go SDK, from PyPI) for `helm lint` / `helm template` of charts/jitserve.
VENV_PY="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"
HELM_SDK="helm-python-sdk==0.2.2"
if [ -x "$VENV_PY" ] && ! "$VENV_PY" -c "import helm_python" >/dev/null 2>&1; then
  echo "setup-k8s: pip install $HELM_SDK"
  "$VENV_PY" -m pip install -q "$HELM_SDK"
fi

packages=(golang-go rsync jq etcd-server golang-github-modern-go-reflect2-dev dpkg-dev openssl)
BINARIES=(kube-apiserver kube-controller-manager kubectl)
all_built() {
  for what in "${BINARIES[@]}"; do [ -x "$BIN/$what" ] || return 1; done
  command -v etcd >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1
}
if all_built; then
  echo "setup-k8s: cached in $BIN"
  exit 0
fi
# One build at a time on this machine (several worktrees share the cache).
mkdir -p "$CACHE"
exec 8>"$CACHE/k8s-v$K8S_VERSION.lock"
flock 8
if all_built; then
  echo "setup-k8s: cached in $BIN (built by another run meanwhile)"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# A deb-src entry for bookworm on the same mirror as the binary packages.
SRC_LIST=/etc/apt/sources.list.d/jitserve-deb-src.sources
if [ ! -e "$SRC_LIST" ]; then
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  [ -n "$uri" ] || { echo "setup-k8s: cannot find the Debian mirror URI" >&2; exit 1; }
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" | $SUDO tee "$SRC_LIST" >/dev/null
  need_update=1
fi
# apt's own lock fails a second apt-get at once; the other setup scripts take this one
exec 7>"$CACHE/apt.lock"
flock 7
if [ "${#missing[@]}" -gt 0 ] || [ "${need_update:-0}" = "1" ]; then
  $SUDO apt-get update -qq
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-k8s: apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
flock -u 7
# etcd-server's maintainer scripts may start a system etcd; the tests use their own
# data dir and ports, so it does not matter, but do not leave a stray one we started.

WORK="$CACHE/build-k8s-v$K8S_VERSION"
mkdir -p "$WORK" "$BIN"
cd "$WORK"
# Debian versions it "1.20.5+really1.20.2-...": the 1.20.2 sources.
if ! ls kubernetes_*really"$K8S_VERSION"*.dsc >/dev/null 2>&1; then
  apt-get source --download-only kubernetes >/dev/null 2>"$WORK/apt-source.log" \
    || { cat "$WORK/apt-source.log" >&2; exit 1; }
  ls kubernetes_*really"$K8S_VERSION"*.dsc >/dev/null 2>&1 \
    || { echo "setup-k8s: Debian's kubernetes source is not $K8S_VERSION" >&2; exit 1; }
fi
SRC="$WORK/src"
if [ ! -d "$SRC/cmd/kube-apiserver" ]; then
  rm -rf "$SRC"
  dpkg-source -x --no-check kubernetes_*.dsc "$SRC" >/dev/null
fi
cd "$SRC"

# The one patch: vendored reflect2 v1.0.1 faults under Go >= 1.18 (map iteration).
R2=vendor/github.com/modern-go/reflect2
if [ ! -e "$R2/.jitserve-patched" ]; then
  rm -rf "$R2"
  mkdir -p "$R2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2/. "$R2/"
  rm -f "$R2/go.mod" "$R2/go.sum"
  find "$R2" -name '*_test.go' -delete
  rm -rf "$R2/test" "$R2/tests"
  touch "$R2/.jitserve-patched"
fi

# Second patch: the vendored go-openapi validators (two copies) decide "is this null?" with
# reflect.DeepEqual on two reflect.Values, which under Go >= 1.18 is true for "" (and any
# zero value), so every empty string in a custom resource is rejected as null ("must be of
# type string: null"). Upstream later reduced the test to data == nil; do the same.
for f in vendor/github.com/go-openapi/validate/type.go vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go; do
  sed -i 's/if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {/if data == nil {/' "$f"
  grep -q 'if data == nil {' "$f" || { echo "setup-k8s: the go-openapi patch did not apply to $f" >&2; exit 1; }
done

# Build as debian/rules does: a GOPATH with k8s.io/kubernetes pointing at the tree.
export GOPATH="$SRC/.go" CGO_ENABLED=0 GOCACHE="$WORK/gocache"
mkdir -p "$GOPATH/src/k8s.io"
[ -e "$GOPATH/src/k8s.io/kubernetes" ] || ln -s ../../.. "$GOPATH/src/k8s.io/kubernetes"
for what in "${BINARIES[@]}"; do
  if [ ! -x "$BIN/$what" ]; then
    echo "setup-k8s: building $what (a few minutes on 2 cores)"
    (cd "$GOPATH/src/k8s.io/kubernetes" && make WHAT="cmd/$what" KUBE_VERBOSE=0 >"$WORK/build-$what.log" 2>&1) \
      || { tail -40 "$WORK/build-$what.log" >&2; exit 1; }
    built=$(find "$SRC/_output" -type f -name "$what" -perm -u+x | head -1)
    install -m 0755 "$built" "$BIN/$what.tmp"
    mv "$BIN/$what.tmp" "$BIN/$what"
  fi
done
# Keep the cache small (the tree and Go's build cache are 2 GB): later runs only need the
# binaries. JITSERVE_K8S_KEEP_BUILD=1 keeps them, for quick rebuilds after a patch.
if [ "${JITSERVE_K8S_KEEP_BUILD:-0}" != "1" ]; then rm -rf "$SRC" "$WORK/gocache"; fi
echo "setup-k8s: built in $(( $(date +%s) - start )) s -> $BIN"
