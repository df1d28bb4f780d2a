VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv example test lint bench bench-quick kernel sanitize sanitize-python clean

venv:
	python3 -m venv $(VENV) && $(VENV)/bin/pip install -q -e '.[test]'

example: venv
	$(PY) examples/quickstart.py

test: venv
	$(PY) -m pytest -q

lint:
	$(PY) -m mypy
	$(PY) -m ruff check k7core k7async tests examples benchmarks

bench: venv
	$(VENV)/bin/pip install -q -e '.[bench]'
	$(PY) -m benchmarks --json bench.json --md bench.md --plot bench.png

bench-quick: venv
	$(PY) -m benchmarks --quick --no-peers

# The fuzz driver (1,000,000 inputs), then the Python kernel tests, both under ASan + UBSan.
sanitize: sanitize-python
	bash tests/k7core/native/sanitize.sh 1 1000000

sanitize-python: venv
	PYTHON=$(PY) bash tests/k7core/native/sanitize_python.sh

kernel:
	$(PY) setup.py -q build_ext --inplace

clean:
	rm -rf build *.egg-info k7core/_native/_k7*.so k7core/_native/_fast*.so k7core/_native/_k7.c
