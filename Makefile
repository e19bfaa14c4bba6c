# Two commands set up a fresh machine and do the work (see README):
#   make report   -> virtual environment, install, run `pathlift report` on its embedded default
#   make test     -> virtual environment, install, ruff, the docs (warnings as errors), the
#                    default test selection
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0

.PHONY: install report test test-slow lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch pinned here, not in pyproject.toml (which asks for torch>=2.3): 2.13.0 is the
	# local CPU build, and an unpinned torch pulls CUDA.
	$(BIN)/pip install -q -e '.[all,dev,docs,lightning]' '$(TORCH)'
	# Torch-Pruning without its dependencies, so that torch stays the pinned build
	$(BIN)/pip install -q --no-deps 'torch-pruning>=1.5'
	# torchvision and timm without their dependencies too (their wheels ask for a CUDA
	# torch); timm's own needs beside them. The tests stub torchvision's compiled-op module.
	$(BIN)/pip install -q --no-deps 'torchvision==0.28.0' 'timm>=1.0'
	$(BIN)/pip install -q 'pyyaml>=6' 'huggingface_hub>=0.20'
	touch $(STAMP)

install: $(STAMP)

report: $(STAMP)
	$(BIN)/pathlift report --out report --overwrite

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# the default selection on every core (pytest-xdist, one test file a worker: module fixtures
# run once), then the tests that time themselves or spawn process groups, alone: collected
# from the files that mark a test `pytest.mark.serial` only, not from all of them again
# (with none found, pytest collects every file: the same tests, only slower)
SERIAL_FILES = $(shell grep -l 'mark\.serial' tests/test_*.py)
test: $(STAMP) lint docs
	# pathlift's bytecode written once (0.4 s), as pip does for an installed package: the
	# editable install leaves none, and under PYTHONDONTWRITEBYTECODE each of the ~80
	# processes the tests start (command lines, ranks) compiled the package again (0.15 s)
	$(BIN)/python -m compileall -q src
	$(BIN)/pytest -n auto --dist loadfile -m 'not slow and not gpu and not serial'
	$(BIN)/pytest -m 'serial and not slow and not gpu' $(SERIAL_FILES)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) report build site *.egg-info src/*.egg-info
