# `make demo` needs only Python: it creates .venv when it is missing, installs Pharos into it
# and runs the demo. `make test` (and `make check`, `make lint`) also install the test and
# development tools, the Node clients the client tests drive (npm) and the compiled modules
# (a C compiler); `make fast` builds only the compiled modules.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Pharos with its runtime dependencies (enough for the demo, doctor, check ...).
RUNTIME_STAMP := $(VENV)/.runtime-stamp
# ... and its test and development tools: a superset, so it stamps the runtime too.
STAMP := $(VENV)/.installed-stamp
PIP_INSTALL := $(PY) -m pip install -q --disable-pip-version-check \
	--config-settings editable_mode=compat

.PHONY: install install-runtime compiled fast demo doctor-demo test check lint docs dist \
	live-engines stress clean

# compat editable mode: twistd finds twisted/plugins only on a real sys.path entry.
$(RUNTIME_STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e .
	touch $(RUNTIME_STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e '.[test,dev]'
	touch $(STAMP) $(RUNTIME_STAMP)

install-runtime: $(RUNTIME_STAMP)

# The Node clients the client tests drive (tests/clients/package.json, exact versions in its
# package-lock.json); npm ci needs node and npm (Debian: apt-get install nodejs npm).
NODE_STAMP := tests/clients/node_modules/.installed-stamp
$(NODE_STAMP): tests/clients/package.json tests/clients/package-lock.json
	cd tests/clients && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# pharos.policy and pharos.linkhash compiled by mypyc (mypy is a dev dependency; needs a C
# compiler and Python's headers): pharos/compiled.py imports each only while it was built from
# the current source, which stays the reference, and imports the source otherwise. Quick when
# current; rebuilt after every edit.
compiled: $(STAMP)
	$(PY) contrib/build_compiled.py

# Optional: the compiled modules, for a faster pick (the demo and twistd use them when built).
fast: compiled

# What the tests need: Pharos with its tools, the Node clients and the compiled modules.
install: $(STAMP) $(NODE_STAMP) compiled

# Pharos on 127.0.0.1:8090 in front of three simulated engines (Ctrl-C stops it). Python
# only: no npm, no C compiler (tests/test_packaging.py runs this chain without them).
demo: $(RUNTIME_STAMP)
	$(VENV)/bin/twistd -n --pidfile= pharos --demo

# pharos doctor on the real engines when installed here, on the recorded captures otherwise.
doctor-demo: install
	$(PY) contrib/doctor_demo.py

lint: install
	$(VENV)/bin/ruff check pharos tests twisted contrib bench
	$(VENV)/bin/mypy

# The documentation site (docs/, Sphinx), warnings as errors, into docs/_build/html.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html

# Layers 1, 2 and 4 (live tests build or install their engines when missing), packaging.
test: lint
	$(PY) -m pytest -ra -p no:cacheprovider

# Layers 1 and 2 only: the quick loop while editing.
check: lint
	PHAROS_LIVE=0 $(PY) -m pytest -ra -p no:cacheprovider -m "not live and not packaging"

# The reliability stress table: ~10 minutes, not part of `make test`. Results go to
# bench/results/stress/ (ignored by git); docs/performance.rst keeps the current figures.
stress: install
	$(PY) contrib/stress/stress.py --out bench/results/stress

live-engines:
	bash tests/live/engines/setup.sh all

# The release artefacts: the sdist and the wheel (built from the sdist) into dist/.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

clean:
	rm -rf $(VENV) build dist *.egg-info pharos/*.mypyc.*
