# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Ranks find mpiexec and the venv's tools through PATH; one thread per rank.
export PATH := $(abspath $(BIN)):$(PATH)
export OMP_NUM_THREADS := 1
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: venv demo test test-fast lab bench clean

venv: $(STAMP)

# Rebuilt only when the dependency declarations change. torch is pinned by constraints.txt
# (the CPU build on this machine's disk); pyproject keeps a range for users.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt "torch==2.13.0"
	$(PIP) install -c constraints.txt -e ".[test,mpich]"
	$(BIN)/python -c "import torch, mpi4py, workbench; assert torch.__version__.startswith('2.13.0')"
	test -x $(BIN)/mpiexec
	touch $(STAMP)

# The main job: Sync EASGD against the original (round-robin) EASGD on 4 ranks; the runs stay
# under data/runs/.
demo: venv
	$(BIN)/workbench compare --algorithms sync-easgd,easgd --ranks 4

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not mpi"

lab: venv
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser notebooks/

bench: venv
	$(BIN)/workbench bench allreduce --ranks 4 --sizes 4K,64K,1M,8M,64M --algorithms all \
		--json benchmarks/results/allreduce_4ranks.json

clean:
	rm -rf $(VENV) build *.egg-info
