#!/usr/bin/env bash
# The service's GPU checks in one call on a lent machine, after scripts/device/service_kit.sh's parts landed:
# install the carried wheels, build what is served from configs (a classifier of all-MiniLM-L6-v2's shape and
# the quick demo's decoder, random or quickly trained weights: speed, not quality), then, each step under its
# own time limit inside DEADLINE_S, the measurements that only a GPU can give:
#
#   1. the CUDA provider loads and one fp16 session runs on it;
#   2. IO binding off vs on, the engine alone (docs/benchmarks.md "IO binding ... (pending a GPU)"): the
#      encoder at batch 1-64, and the decoder with its KV cache on the device (`same_tokens` must be True);
#   3. the latency target against fixed batching, open loop (issue 23's last figure): the MiniLM-shaped
#      classifier served on the GPU, each setting on a fresh server, at a low and a high offered rate.
#
#   bash scripts/device/service_checks.sh STAGE OUT     # STAGE: carry.py join's folder; OUT: what comes back
#
# OUT gets summary.md (every step's command, exit status and last lines) and checks.tar.gz (the reports and
# the full logs). Knobs: DEADLINE_S (540: the call's own limit less its transfers), DEVICE (gpu; cpu runs the
# same steps on this CPU, the dry run tests/scripts/test_service_checks.py does), RATES ("1000 4000": the
# open loop's offered requests a second), SETTINGS ("32:0,128:0,target:15,target:40"), LOAD_S (8 a setting).
set -uo pipefail
if [[ $# -ne 2 ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
STAGE=$1 OUT=$2
DEVICE=${DEVICE:-gpu}
DEADLINE_S=${DEADLINE_S:-540}
PY=${PY:-python3}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/reports" "$W/logs"
t0=$SECONDS

if [[ -d $STAGE/files ]]; then  # the carried wheels over the machine's own packages, for every process
  site=$STAGE/site
  [[ -d $site ]] || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$STAGE"/files/*.whl
  export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

step() {  # step NAME LIMIT_S COMMAND...: run under the smaller of its limit and what the deadline leaves
  local name=$1 limit=$2 left rc
  shift 2
  left=$((DEADLINE_S - (SECONDS - t0) - 15))
  if ((left < 20)); then
    printf '\n## %s\n\nskipped: %s s left of DEADLINE_S=%s\n' "$name" "$left" "$DEADLINE_S" >> "$W/summary.md"
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "[$((SECONDS - t0)) s] $name (up to $limit s)"
  timeout "$limit" "$@" > "$W/logs/$name.log" 2>&1
  rc=$?
  {
    printf '\n## %s\n\n`%s`: exit %s after %s s\n\n```\n' "$name" "$*" "$rc" "$((SECONDS - t0))"
    grep -v -E "it/s\]|s/it\]" "$W/logs/$name.log" | tail -n 30
    printf '```\n'
  } >> "$W/summary.md"
  tail -n 5 "$W/logs/$name.log"
  return "$rc"
}

printf '# Service checks on %s (%s)\n' "$(hostname)" "$DEVICE" > "$W/summary.md"
step providers 60 "$PY" -c "
import onnxruntime as ort, numpy as np
ort.preload_dlls()
print('onnxruntime', ort.__version__, ort.get_available_providers())
import service.app, fastapi, pydantic, uvicorn  # the service's own imports, with the carried wheels
print('service imports: ok')
if '$DEVICE' == 'gpu':  # listed is not loaded: one fp16 Add on the CUDA provider
    from onnx import TensorProto, helper
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT16, [4]) for n in 'xy')
    graph = helper.make_graph([helper.make_node('Add', ['x', 'x'], ['y'])], 'add', [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=['CUDAExecutionProvider'])
    assert session.get_providers()[0] == 'CUDAExecutionProvider', f'fell back: {session.get_providers()}'
    print(session.get_providers(), session.run(None, {'x': np.ones(4, np.float16)})[0])
" || { [[ $DEVICE == gpu ]] && echo "no service stack: the checks stop here"; }

models=$W/models
step demo 120 "$PY" -m training demo --quick --tasks text-classification,text-generation --out "$W/demo"
variants=$([[ $DEVICE == gpu ]] && echo fp32,fp16 || echo fp32)
step minilm-shaped 240 "$PY" -c "
from pathlib import Path
from benchmarks.http_bench import minilm_shaped
minilm_shaped(Path('$W/demo'), Path('$models'))"
step lm-export 180 "$PY" -m export "$W/demo/text-generation/student" --task text-generation --name lm \
  --repository "$models" --variants "$variants" --eval-data "$W/demo/data/text/eval.txt"
step lm-optimum 180 "$PY" -m benchmarks.io_binding_bench export "$W/demo/text-generation/student" "$W/optimum"

step io-encoder 120 "$PY" -m benchmarks.io_binding_bench encoder "$models/minilm-shaped/1" --device "$DEVICE" \
  --rounds 3 --seconds 1 --out "$W/reports/io-encoder.md"
decoder=(--device "$DEVICE" --rounds 3 --new-tokens 32)  # the quick demo's decoder holds 64 positions
step io-decoder-device-cache 120 "$PY" -m benchmarks.io_binding_bench decoder "$W/optimum/lm/1" "${decoder[@]}" \
  --out "$W/reports/io-decoder-device-cache.md"
step io-decoder-host-cache 120 "$PY" -m benchmarks.io_binding_bench decoder "$models/lm/1" "${decoder[@]}" \
  --variant "${variants##*,}" --out "$W/reports/io-decoder-host-cache.md"

for rate in ${RATES:-1000 4000}; do
  step "open-loop-$rate" 200 env DISTILSERVE_DEVICE="$DEVICE" "$PY" -m benchmarks.open_loop --repository "$models" \
    --model minilm-shaped --rate "$rate" --settings "${SETTINGS:-32:0,128:0,target:15,target:40}" \
    --seconds "${LOAD_S:-8}" --out "$W/reports"
done

echo "[$((SECONDS - t0)) s] done"
cp "$W/summary.md" "$OUT/summary.md"
tar czf "$OUT/checks.tar.gz" -C "$W" reports logs summary.md
rm -rf "$W"
