#!/usr/bin/env bash
# The GPU check in one command, for a CUDA machine lent for a few minutes: the `cuda` tests, then bench_gpu.py on
# SmolLM2-135M (fp32, bf16) and Gemma 3 270M (fp32, bf16), most important first. Every figure is appended to
# OUT/results.jsonl as it is measured and every log is written under OUT, so a run stopped at its time limit keeps
# what it measured.
#
#     bash benchmarks/gpu_check.sh [OUT] [extra bench_gpu.py options, e.g. --smoke]
#
# Runs with the python3 on the PATH (PYTHON= names another), where resid must be installed (pip install -e .) with
# torch, transformers and pytest. Models: --weights random (benchmarks/gpu_models.py), built
# on the machine from the committed configs, so nothing large has to travel to it. SECONDS_SMOLLM2 and
# SECONDS_GEMMA bound each model's share of the time (defaults 330 and 200); STAGES picks the stages (default
# "tests smollm2 gemma3").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
shift || true
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

STAGES=" ${STAGES:-tests smollm2 gemma3} "
# The tests of every GPU path against the CPU (the real-SmolLM2 ones are `slow` and need its GGUF: not here).
[[ $STAGES == *" tests "* ]] && timeout 150 "$PY" -m pytest -q -m "cuda and not slow" -p no:cacheprovider -rs \
  tests/analyses/test_gpu_analyses.py tests/core/test_batching.py tests/core/test_dtype.py \
  tests/core/test_generate.py tests/dictionaries/test_gpu_dictionaries.py tests/graphs/test_graph_gpu.py \
  tests/training/test_training_gpu.py 2>&1 | tee "$OUT/cuda-tests.log"

[[ $STAGES == *" smollm2 "* ]] && timeout "${SECONDS_SMOLLM2:-330}" "$PY" benchmarks/bench_gpu.py --weights random \
  --models smollm2-135m --out "$OUT/results.jsonl" "$@" 2>&1 | tee "$OUT/bench-smollm2.log"
[[ $STAGES == *" gemma3 "* ]] && timeout "${SECONDS_GEMMA:-200}" "$PY" benchmarks/bench_gpu.py --weights random \
  --models gemma-3-270m --out "$OUT/results.jsonl" "$@" 2>&1 | tee "$OUT/bench-gemma3.log"
echo "gpu_check.sh: done, records in $OUT/results.jsonl"
