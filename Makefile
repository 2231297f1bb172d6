# Two entry points (see README): `make demo` and `make test`. Both set up .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_GOAL ?= improve throughput by 2.5x without accuracy loss within 12 trials

.PHONY: demo test lint clean-state

# torch==2.13.0 (the `serve` extra) resolves to the local CPU wheel on these machines.
$(VENV)/.serve: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[serve]'
	touch $@

# The test extra adds pytest, the openai client, psycopg and aiperf (for the cross-check).
$(VENV)/.test: $(VENV)/.serve
	$(PY) -m pip install -q -e '.[serve,test]'
	touch $@

demo: $(VENV)/.serve
	$(VENV)/bin/infergoal goal "$(DEMO_GOAL)"

test: $(VENV)/.test
	$(PY) -m pytest -q --durations=15

lint: $(VENV)/.test
	$(VENV)/bin/ruff check orchestrator gates tests benchmarks examples

clean-state:
	rm -rf .infergoal
