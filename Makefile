# Two commands do all set-up on a fresh machine (a virtual environment in .venv):
#   make example   installs etweave and converts the bundled example run
#   make test      installs etweave with its test dependencies and runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: example test unit bench bench-ranks bench-whatif lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

example: $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/etweave example -o etweave-example

test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/ruff check etweave tests bench examples
	$(BIN)/mypy
	$(BIN)/pytest

unit: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pytest tests/unit

bench: $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/python -m bench.run

bench-ranks: $(BIN)/python
	$(BIN)/pip install -q -e '.[cluster]'
	$(BIN)/python -m bench.ranks --sizes 8,64,256,1024 --dask 64 --fewest-runs 2

bench-whatif: $(BIN)/python
	$(BIN)/pip install -q -e '.[collect]'
	$(BIN)/python -m bench.whatif
