#!/usr/bin/env bash
# Regenerate the analyzer's gRPC stubs from src/jitserve/analyzer/proto/analyzer.proto.
#
#   scripts/gen-proto.sh            write the stubs in place
#   scripts/gen-proto.sh OUTDIR     write them under OUTDIR (tests compare with the repo)
#
# Uses grpcio-tools (the dev extra) from $PYTHON (default: .venv/bin/python, else python3).
# protoc writes a .pyi stub for the message module; the generated files are not
# strict-clean, so a "mypy: ignore-errors" line is prepended to the .pyi and _grpc.py.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
out="${1:-$root/src}"
mkdir -p "$out/jitserve/analyzer/proto"
cd "$root/src"
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  jitserve/analyzer/proto/analyzer.proto
for generated in analyzer_pb2_grpc.py analyzer_pb2.pyi; do
  file="$out/jitserve/analyzer/proto/$generated"
  { printf '# mypy: ignore-errors\n'; cat "$file"; } > "$file.tmp"
  mv "$file.tmp" "$file"
done
