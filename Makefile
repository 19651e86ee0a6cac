# Entry points for a fresh machine; each creates .venv first when needed (scripts/make-venv).
#   make example   install moegen (jax included) and optax (the quick start trains a layer),
#                  then build specs/mixtral_small_cpu.yaml
#                  end to end: all a CPU target needs
#   make setup     install the test set-up too: the dev, tpu, checkpoints, oracle and flax
#                  extras (pytest, libtpu, safetensors, torch and transformers, flax)
#   make test      set up, then run the test suite
#   make test-fast set up, then the fast loop (pytest -m "not slow": no child-process compiles)
#   make check     set up, then check generated/ and the JSON Schema are fresh
# Each level has its stamp in .venv, so `make example` then `make test` adds to the same .venv.
# GPU targets (kernel te) are lowered for CUDA with Transformer Engine, which needs a build:
#   make te        install it into .venv (scripts/install-te; ~11 min once, then cached)
#   make test-te   install it, then run the tests that lower for CUDA, requiring TE
# Kernel tokamax (Pallas Mosaic GPU, pure Python) lowers with tokamax alone:
#   make gpu-kernels  install the gpu-kernels extra (tokamax 0.0.17) with jax held at its pin
VENV := .venv
CORE_STAMP := $(VENV)/.moegen-core-installed
STAMP := $(VENV)/.moegen-installed
EXAMPLE ?= specs/mixtral_small_cpu.yaml

TE_STAMP := $(VENV)/.moegen-te-installed
TE_TESTS := tests/test_te_lowering.py tests/test_gpu_targets.py tests/test_te_slices.py tests/test_te_features.py tests/test_tokamax.py
GPU_KERNELS_STAMP := $(VENV)/.moegen-gpu-kernels-installed

.PHONY: setup example test test-fast check te test-te gpu-kernels

setup: $(STAMP)

$(CORE_STAMP): pyproject.toml scripts/make-venv
	./scripts/make-venv $(VENV)
	@echo "installing moegen, jax and optax into $(VENV) (about a minute; pip prints nothing meanwhile)"
	$(VENV)/bin/python -m pip install -q -e ".[train]"
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	@echo "installing the test set-up (pytest, libtpu, torch and transformers, flax: ~6 GB, a few minutes; pip prints nothing meanwhile)"
	$(VENV)/bin/python -m pip install -q -e ".[dev,tpu,checkpoints,oracle,flax]"
	touch $(STAMP)

example: $(CORE_STAMP)
	$(VENV)/bin/moegen build $(EXAMPLE)

# MOEGEN_REQUIRE_ORACLE: the transformers oracle tests fail, not skip, without transformers.
test: $(STAMP)
	MOEGEN_REQUIRE_ORACLE=1 $(VENV)/bin/pytest -q

test-fast: $(STAMP)
	MOEGEN_REQUIRE_ORACLE=1 $(VENV)/bin/pytest -q -m "not slow"

check: $(STAMP)
	$(VENV)/bin/moegen check
	$(VENV)/bin/moegen schema --check

te: $(TE_STAMP)

$(TE_STAMP): $(STAMP) scripts/install-te moegen/kernels/libcuda_stub.c
	./scripts/install-te $(VENV)
	touch $(TE_STAMP)

# pip is held to the pinned jax (read from pyproject.toml) so that tokamax cannot move it.
gpu-kernels: $(GPU_KERNELS_STAMP)

$(GPU_KERNELS_STAMP): $(STAMP) pyproject.toml
	grep -oE '"jax(lib)?==[^"]+"' pyproject.toml | head -2 | tr -d '"' >$(VENV)/moegen-jax-pin.txt
	$(VENV)/bin/python -m pip install -q -c $(VENV)/moegen-jax-pin.txt -e ".[gpu-kernels]"
	touch $(GPU_KERNELS_STAMP)

# Only the tests marked gpu_library: the rest of these files ran in make test.
test-te: $(TE_STAMP) $(GPU_KERNELS_STAMP)
	MOEGEN_REQUIRE_TE=1 MOEGEN_REQUIRE_TOKAMAX=1 $(VENV)/bin/pytest -q -m gpu_library $(TE_TESTS)

# The documentation site: docs/ and the reference generated from the code, built into site/;
# --strict fails on any warning (a broken link between pages, a page left out of the nav).
# It needs moegen and mkdocs alone: the core install, not the test set-up (6.8 GB).
DOCS_STAMP := $(VENV)/.moegen-docs-installed
.PHONY: docs
docs: $(DOCS_STAMP)
	$(VENV)/bin/python -m moegen.docs_reference --check
	$(VENV)/bin/mkdocs build --strict -d site

$(DOCS_STAMP): $(CORE_STAMP) pyproject.toml
	$(VENV)/bin/python -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)
