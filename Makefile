# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Ranks find mpiexec and the venv's tools through PATH; one thread per rank.
export PATH := $(abspath $(BIN)):$(PATH)
export OMP_NUM_THREADS := 1
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: venv demo compare test chromium slurm netns datasets slurm-up slurm-down test-fast lab bench clean

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

# The main job: the quickstart notebook executed headless (a cluster of 4 MPI engines, Sync EASGD
# with the live dashboard, then original EASGD beside Sync EASGD on the 1.1M-parameter MLP); the
# executed notebook and an HTML report (plotly.js once, no widget state: about 5 MB each) and the
# runs stay under data/runs/.
# `make compare` is the batch form: Sync EASGD against the original EASGD under mpiexec.
demo: venv
	$(BIN)/python -m workbench.demo

compare: venv
	$(BIN)/workbench compare --algorithms sync-easgd,easgd --ranks 4

# Unit, MPI and cluster tests, then every notebook executed by nbval (outputs not compared,
# errors fail; cells that take long have their own timeouts).
test: venv chromium slurm netns datasets
	$(BIN)/python -m pytest -q tests notebooks --nbval-lax --nbval-cell-timeout=600

# The browser test drives Debian's chromium (never `playwright install`): installed with apt-get
# when missing (as root, or with sudo when it is available without a password).
chromium:
	@test -x /usr/bin/chromium || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; }

# The Slurm tests bring up a private single-node Slurm (tests/slurm_fixture.py): Debian's daemons,
# installed with apt-get when missing (as root, or with sudo when it is available without a password).
slurm:
	@test -x /usr/sbin/slurmctld -a -x /usr/sbin/slurmd -a -x /usr/sbin/munged -a -x /usr/bin/srun || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q slurmctld slurmd slurm-client munge; }

# Fashion-MNIST (dataset="fashion-mnist"): Debian's dataset-fashion-mnist, the four IDX gzip files under
# /usr/share/datasets/fashion-mnist/ (30 MB), installed with apt-get when missing; never downloaded at run time.
datasets:
	@test -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q dataset-fashion-mnist; }

# The virtual-cluster tests build namespaced nodes with iproute2 (ip, tc) and util-linux (nsenter,
# unshare, setpriv), installed with apt-get when missing.
netns:
	@test -x /usr/sbin/ip -a -x /usr/sbin/tc -a -x /usr/bin/nsenter -a -x /usr/bin/unshare -a -x /usr/bin/setpriv || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q iproute2 util-linux; }

# A private Slurm for developers (own munged, slurmctld and slurmd on 127.0.0.1, under
# $TMPDIR/workbench-slurm, default /tmp): `make slurm-up` prints the `export SLURM_CONF=...` line to
# paste and keeps running until Ctrl-C; `make slurm-down` stops it from another shell.
SLURM_ROOT ?= $(or $(TMPDIR),/tmp)/workbench-slurm
slurm-up: venv slurm
	$(BIN)/python -m workbench.runtime.launch.slurm_local up --root $(SLURM_ROOT)

slurm-down: venv
	$(BIN)/python -m workbench.runtime.launch.slurm_local down --root $(SLURM_ROOT)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not mpi and not slurm"

# Runs and the store stay under the repository's data/, whichever directory a notebook runs in.
lab: venv
	WORKBENCH_RUNS=$(abspath data/runs) WORKBENCH_STORE=$(abspath data/workbench.sqlite) \
		$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

# `auto` tunes itself inside the run (no decisions cached in ~/.cache from earlier, other loads)
bench: venv
	WORKBENCH_TUNING_CACHE=none $(BIN)/workbench bench allreduce --ranks 4 --sizes 4K,64K,1M,8M,64M \
		--algorithms all --json benchmarks/results/allreduce_4ranks.json

clean:
	rm -rf $(VENV) build *.egg-info
