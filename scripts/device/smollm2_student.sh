#!/usr/bin/env bash
# The SmolLM2 student on one GPU, in minutes: import the GGUF teacher, cache its top-64 logits over all of
# WikiText-2 train, distil one 10-layer student per recipe in parallel for a fixed training budget (the step
# count sized from a short probe so the cosine schedule ends inside it), score each on all of WikiText-2
# valid, and pack the best for a machine that takes back little (scripts/device/pack_student.py).
# A lent machine hands back at most 8 files and 64 MiB a call: OUT holds the 6 files of the pack alone. A
# 10-layer pack is 58 MiB; a 12-layer one 70 MiB, so its last part comes back from a second call on the warm
# machine (`pack_student.py pack` again into a new folder: the pack is the same bytes, checksummed).
#
#   scripts/device/smollm2_student.sh GGUF DATA WORK OUT
#
# DATA holds wikitext2_raw_train.txt and wikitext2_raw_valid.txt. Knobs: LAYERS (10), BLOCK (tokens a block,
# cached and scored: 256; a student for long prompts needs long blocks: 2048 with BATCH=4), BATCH (32 blocks),
# LR (3e-4), TRAIN_S (seconds of training per recipe, all recipes at once: 240), MAX_EPOCHS
# (10), RECIPES (name:alpha_kd:alpha_hard[:layer_map[:alpha_attention]], space-separated, run side by side;
# alpha_attention > 0 matches the student's attention to the teacher's in ATTENTION_LAYERS (teacher layers
# the map keeps: 17,18,20,23,24, SmolLM2's induction layers), the teacher running beside it on every
# ATTENTION_EVERY-th step (1; the others cost what a step without it does; 12 layers, blocks of 2,048 x 4,
# every 4th: 8.8 steps/s on an H200 against ~15 without (v7's run), and no better a student at equal steps); "mixed1:1:1", the
# figure in docs/benchmarks.md; the first run there was "kd:1:0 mixed:1:0.5"; a layer map, e.g.
# 0,1,2,6,11,16,17,18,20,23,24,29, replaces the even spread for that recipe), STEPS (steps per recipe; set, it skips
# the probe: an H200 makes 14.4 steps/s with one recipe, 12.1 each with two), GEN_PROMPTS (set: the teacher
# first continues that many openings of train's lines, `lm-generate`, and the cache covers train and that
# text: more text once ~10 passes over train overfit), GEN_PROMPT_TOKENS (32), GEN_NEW_TOKENS (224),
# GEN_BATCH (256), GEN_TEMPERATURE (1.0; 0.01 is near-greedy: the contexts a greedy teacher serves, the text
# a speculative draft is checked on), GEN_S (seconds the generation may take: it stops there with what it
# wrote), STEPS_PER_S (set: one recipe's measured rate, the step count then sized from it and TRAIN_S with no probe), PY (python3).
# RAW (set: the text exactly as written, line breaks and headings kept, for the cache and every score, as
# lm-evaluation-harness scores it; default: prose lines with eos between them). EVAL_BLOCKS ("$BLOCK 256"): each student is scored on all of valid in blocks of each size, in turn
# (lm_eval-SIZE.json; the first size picks the best student and is its lm_eval.json). STOP_AFTER=cache:
# stop once the cache is built; the same command again (the machine still warm) skips the import and the
# generation (a cache, once made, fixes its text) and trains: a long generation and a long training then
# each get a call of their own (a call may run 10 minutes).
# DEADLINE_S (set: the seconds the whole call may run, e.g. 590 for a 600-s call): training stops early
# enough to leave SCORE_S (60) a recipe for scoring and 30 s for the pack; a recipe stopped there is saved
# and says so ("run again to continue": the same command continues it from its checkpoint). Without it a call
# that runs out is killed with nothing saved: an H200 trains two 12-layer recipes side by side at 8.5
# steps/s each on blocks of 2,048 x 4 (16 alone), so STEPS set by hand must fit that.
# Embeddings stay the teacher's (--freeze-embeddings): the student's own tensors are then 35 M parameters.
set -euo pipefail
if [[ $# -ne 4 ]]; then  # --help, or arguments missing: the comment above
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
GGUF=$1 DATA=$2 WORK=$3 OUT=$4
PY=${PY:-python3}
LAYERS=${LAYERS:-10}
BATCH=${BATCH:-32}
BLOCK=${BLOCK:-256}
LR=${LR:-3e-4}
TRAIN_S=${TRAIN_S:-240}
MAX_EPOCHS=${MAX_EPOCHS:-10}
RECIPES=${RECIPES:-"mixed1:1:1"}
RAW=${RAW:+--raw}
EVAL_BLOCKS=$(printf '%s\n' ${EVAL_BLOCKS:-$BLOCK 256} | awk '!seen[$0]++')
FIRST_EVAL=${EVAL_BLOCKS%%$'\n'*}
mkdir -p "$WORK" "$OUT"
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }

[[ -d $WORK/teacher ]] || $PY -m training import "$GGUF" --out "$WORK/teacher"
stamp imported
train=$DATA/wikitext2_raw_train.txt
if [[ -n ${GEN_PROMPTS:-} && ! -f $WORK/cache/meta.json ]]; then  # a cache made fixes its text: no more after
  $PY -m training lm-generate --teacher "$WORK/teacher" --train "$train" --out "$WORK/generated.txt" \
    --prompts "$GEN_PROMPTS" --prompt-tokens "${GEN_PROMPT_TOKENS:-32}" --new-tokens "${GEN_NEW_TOKENS:-224}" \
    --batch-size "${GEN_BATCH:-256}" --temperature "${GEN_TEMPERATURE:-1.0}" --bf16 ${GEN_S:+--time-limit "$($PY -c "print(${GEN_S} / 60)")"}
  stamp "generated $(wc -l < "$WORK/generated.txt") lines"
  cat "$train" "$WORK/generated.txt" > "$WORK/train-plus-generated.txt"
fi
[[ -n ${GEN_PROMPTS:-} ]] && train=$WORK/train-plus-generated.txt
$PY -m training lm-cache --teacher "$WORK/teacher" --train "$train" --out "$WORK/cache" \
  --top-k 64 --block-size "$BLOCK" $RAW --batch-size "$((64 * 256 / BLOCK > 0 ? 64 * 256 / BLOCK : 1))"
stamp cached
if [[ ${STOP_AFTER:-} == cache ]]; then exit 0; fi
blocks=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['num_blocks'])" "$WORK/cache/meta.json")

distil() {  # distil NAME ALPHA_KD ALPHA_HARD STEPS [more flags]
  $PY -m training distil-lm --teacher "$WORK/teacher" --cache "$WORK/cache" --out "$WORK/$1" --layers "$LAYERS" \
    --steps "$4" --batch-size "$BATCH" --lr "$LR" --warmup-steps 50 --temperature 1 --alpha-kd "$2" \
    --alpha-hard "$3" --bf16 --freeze-embeddings --checkpoint-every 1000000 "${@:5}"
}

recipe() {  # recipe RECIPE STEPS [NAME [more flags]]: one RECIPES entry distilled (as NAME, if given)
  local name kd hard layer_map attention
  IFS=: read -r name kd hard layer_map attention <<< "$1"
  distil "${3:-$name}" "$kd" "$hard" "$2" "${@:4}" ${layer_map:+--layer-map "$layer_map"} \
    ${attention:+--alpha-attention "$attention" --attention-layers "${ATTENTION_LAYERS:-17,18,20,23,24}"} \
    ${attention:+--attention-every "${ATTENTION_EVERY:-1}"}
}

if [[ -n ${STEPS:-} ]]; then
  steps=$STEPS
  stamp "each recipe trains $steps steps of $BATCH blocks" \
    "($(python3 -c "print(round($steps * $BATCH / $blocks, 2))") epochs of $blocks blocks)"
else
  if [[ -n ${STEPS_PER_S:-} ]]; then  # a rate measured before: no probe
    probe_steps=$STEPS_PER_S probe_s=1
  else  # probe: how many steps the first recipe makes in 30 s of training (list the slowest first)
    rm -rf "$WORK/probe"
    recipe "${RECIPES%% *}" 1000000 probe --time-limit 0.5 > "$WORK/probe.log" 2>&1
    read -r probe_steps probe_s < <($PY -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['step'], s['session_seconds'])" "$WORK/probe/train_state.json")
  fi
  runs=$(wc -w <<< "$RECIPES")
  steps=$($PY -c "
import sys; p_steps, p_s, budget, runs, blocks, batch, epochs = map(float, sys.argv[1:])
parallel = 1.0 if runs == 1 else 0.55  # each of several runs at once gets at least ~half the GPU
print(int(min(p_steps / p_s * budget * parallel, epochs * blocks / batch)))" \
    "$probe_steps" "$probe_s" "$TRAIN_S" "$runs" "$blocks" "$BATCH" "$MAX_EPOCHS")
  stamp "probe: $probe_steps steps in $probe_s s; each recipe trains $steps steps of $BATCH blocks" \
    "($(python3 -c "print(round($steps * $BATCH / $blocks, 2))") epochs of $blocks blocks)"
fi

train_s=$($PY -c "
import sys; train, deadline, elapsed, runs, score = sys.argv[1:]
limit = float(train) * 1.3
if deadline:
    left = float(deadline) - float(elapsed) - int(runs) * float(score) - 30
    if left < 30:
        sys.exit(f'DEADLINE_S={deadline}: {left:.0f} s left for training after {elapsed} s, the scoring and the pack')
    limit = min(limit, left)
print(round(limit))" "$TRAIN_S" "${DEADLINE_S:-}" "$((SECONDS - t0))" "$(wc -w <<< "$RECIPES")" "${SCORE_S:-60}")
stamp "training stops within $train_s s"
for entry in $RECIPES; do
  recipe "$entry" "$steps" "" --time-limit "$($PY -c "print($train_s / 60)")" > "$WORK/${entry%%:*}.log" 2>&1 &
done
wait
stamp trained
for recipe in $RECIPES; do
  name=${recipe%%:*}
  tail -n 2 "$WORK/$name.log"
  for block in $EVAL_BLOCKS; do
    $PY -m training eval-lm --teacher "$WORK/teacher" --student "$WORK/$name" \
      --eval "$DATA/wikitext2_raw_valid.txt" --block-size "$block" $RAW \
      --batch-size "$((16 * 256 / block > 0 ? 16 * 256 / block : 1))" 2>&1 | tail -n 3
    cp "$WORK/$name/lm_eval.json" "$WORK/$name/lm_eval-$block.json"
  done
  cp "$WORK/$name/lm_eval-$FIRST_EVAL.json" "$WORK/$name/lm_eval.json"
done
stamp evaluated
best=$($PY -c "
import json, sys
block, work, names = sys.argv[1], sys.argv[2], sys.argv[3:]
scores = {n: json.load(open(f'{work}/{n}/lm_eval-{block}.json'))['perplexity_ratio'] for n in names}
print(min(scores, key=scores.get))" "$FIRST_EVAL" "$WORK" $(for r in $RECIPES; do echo "${r%%:*}"; done))
stamp "packing $best"
$PY scripts/device/pack_student.py pack "$WORK/$best" "$WORK/teacher" "$OUT"
stamp done
