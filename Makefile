# Entry points for a fresh machine; each creates .venv first when needed (scripts/make-venv).
#   make example   install moegen (jax included) and optax (the quick start trains a layer),
#                  then build specs/mixtral_small_cpu.yaml
#                  end to end: all a CPU target needs
#   make setup     install the test set-up too: the dev, tpu, checkpoints, oracle and flax
#                  extras (pytest, libtpu, safetensors, torch and transformers, flax)
#   make test      set up, then run the test suite (the README's quick start on .venv/example,
#                  a venv set up as `make example` sets up .venv: what it installs, alone)
#   make test-fast set up, then the fast loop (pytest -m "not slow": no child-process compiles)
#   make check     set up, then check generated/ and the JSON Schema are fresh
# Each level has its stamp in .venv, so `make example` then `make test` adds to the same .venv.
# GPU targets (kernel te) are lowered for CUDA with Transformer Engine, which needs a build:
#   make te        install it into .venv (scripts/install-te; ~10 min once, then cached)
#   make test-te   install it, then run the tests that lower for CUDA, requiring TE
# Kernel tokamax (Pallas Mosaic GPU, pure Python) lowers with tokamax alone:
#   make gpu-kernels  install the gpu-kernels extra (tokamax 0.0.17) with jax held at its pin
VENV := .venv
CORE_STAMP := $(VENV)/.moegen-core-installed
STAMP := $(VENV)/.moegen-installed
EXAMPLE ?= specs/mixtral_small_cpu.yaml

TE_STAMP := $(VENV)/.moegen-te-installed
TE_TESTS := tests/kernels/test_te_lowering.py tests/kernels/test_gpu_targets.py tests/kernels/test_te_slices.py tests/kernels/test_te_features.py tests/kernels/test_tokamax.py
GPU_KERNELS_STAMP := $(VENV)/.moegen-gpu-kernels-installed

.PHONY: setup example test test-fast check te test-te gpu-kernels

setup: $(STAMP)

# The core install (what `make example` needs) into the venv $*: a pattern rule, so that the
# quick start's own venv (EXAMPLE_VENV, below) is made by the same recipe as .venv.
%/.moegen-core-installed: pyproject.toml scripts/make-venv
	./scripts/make-venv $*
	@echo "installing moegen, jax and optax into $* (about a minute; pip prints nothing meanwhile)"
	$*/bin/python -m pip install -q -e ".[train]"
	touch $@

$(STAMP): $(CORE_STAMP)
	@echo "installing the test set-up (pytest, libtpu, torch and transformers, flax: ~6 GB, a few minutes; pip prints nothing meanwhile)"
	$(VENV)/bin/python -m pip install -q -e ".[dev,tpu,checkpoints,oracle,flax]"
	touch $(STAMP)

example: $(CORE_STAMP)
	$(VENV)/bin/moegen build $(EXAMPLE)

# MOEGEN_REQUIRE_ORACLE: the transformers oracle tests fail, not skip, without transformers.
# The README's quick start runs on EXAMPLE_VENV, a second venv made as `make example` makes
# .venv (the core install alone: the test set-up in .venv would hide a dependency the core
# lacks); inside .venv, so that it is ignored and removed with it. MOEGEN_REQUIRE_EXAMPLE_VENV:
# that test fails, not skips, without it.
EXAMPLE_VENV := $(VENV)/example
test: $(STAMP) $(EXAMPLE_VENV)/.moegen-core-installed
	MOEGEN_REQUIRE_ORACLE=1 MOEGEN_EXAMPLE_VENV=$(abspath $(EXAMPLE_VENV)) \
	  MOEGEN_REQUIRE_EXAMPLE_VENV=1 $(VENV)/bin/pytest -q

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
