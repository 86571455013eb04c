#!/usr/bin/env bash
# The service's stack for a lent GPU machine, in call-sized parts: that machine has PyTorch, CUDA and ONNX but
# no registry, and no FastAPI, pydantic, uvicorn or onnxruntime-gpu. This downloads, for its Python (3.12,
# x86-64), the wheels of every package the service, the export and the benchmarks need there and it lacks, at
# the versions this checkout's .venv runs (onnxruntime-gpu at the CPU runtime's version), and cuts them into
# parts that each travel with the working tree in one call (scripts/device/carry.py):
#
#   scripts/device/service_kit.sh [OUT]        # here; OUT defaults to build/device-carry/service
#
# then on the warm machine, one call per part K (carry: ["OUT/callK"]), the last one running the checks:
#
#   python3 scripts/device/carry.py join OUT/callK /tmp/carried
#   python3 scripts/device/carry.py join OUT/callN /tmp/carried && bash scripts/device/service_checks.sh /tmp/carried $OUT
#
# PY (.venv/bin/python): the interpreter whose package versions are pinned. PART_MIB (50): each part's size,
# the rest of a call's 64 MiB left to the working tree.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
OUT=${1:-build/device-carry/service}
PY=${PY:-.venv/bin/python}
PACKAGES=(
  fastapi starlette pydantic pydantic-core pydantic-settings typing-inspection annotated-types python-dotenv
  uvicorn httptools msgspec llguidance  # the service
  transformers tokenizers huggingface-hub optimum optimum-onnx onnx-ir  # the export (transformers < 4.58)
)
version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
pins=("onnxruntime-gpu==$(version onnxruntime)")
for name in "${PACKAGES[@]}"; do pins+=("$name==$(version "$name")"); done
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
platforms=(--platform manylinux2014_x86_64)  # llguidance needs 2.31; the machine's own glibc is not read yet
for minor in $(seq 17 39); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
for pin in "${pins[@]}"; do
  echo "downloading $pin"
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$wheels" "$pin" > "$wheels/pip.log" 2>&1; then
    grep -v "is ignored: it is neither" "$wheels/pip.log" >&2
    exit 1
  fi
done
"$PY" scripts/device/carry.py split "$wheels"/*.whl --out "$OUT" --part-mib "${PART_MIB:-50}"
