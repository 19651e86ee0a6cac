# Two entry points for a fresh machine; both create .venv first when needed.
#   make example   set up, then build specs/mixtral_small_cpu.yaml end to end
#   make test      set up, then run the test suite
VENV := .venv
STAMP := $(VENV)/.moegen-installed
EXAMPLE ?= specs/mixtral_small_cpu.yaml

.PHONY: setup example test check

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/make-venv
	./scripts/make-venv $(VENV)
	$(VENV)/bin/python -m pip install -q -e ".[dev,tpu]"
	touch $(STAMP)

example: $(STAMP)
	$(VENV)/bin/moegen build $(EXAMPLE)

test: $(STAMP)
	$(VENV)/bin/pytest -q

check: $(STAMP)
	$(VENV)/bin/moegen check
	$(VENV)/bin/moegen schema --check
