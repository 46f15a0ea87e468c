# The two set-up commands of README.rst: `make demo` and `make test`.
# Each creates .venv when it is missing, installs Pharos with its test tools, then runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install compiled demo doctor-demo test check lint docs live-engines stress clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# compat editable mode: twistd finds twisted/plugins only on a real sys.path entry
	$(PY) -m pip install -q --disable-pip-version-check \
		--config-settings editable_mode=compat -e '.[test,dev]'
	touch $(STAMP)

# The Node clients the client tests drive (tests/clients/package.json, exact versions in its
# package-lock.json); npm ci needs node and npm (Debian: apt-get install nodejs npm).
NODE_STAMP := tests/clients/node_modules/.installed-stamp
$(NODE_STAMP): tests/clients/package.json tests/clients/package-lock.json
	cd tests/clients && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# pharos.policy and pharos.linkhash compiled by mypyc (mypy is a dev dependency; needs a C
# compiler and Python's headers): pharos/compiled.py imports each only while it was built from
# the current source, which stays the reference. Quick when current; rebuilt after every edit.
compiled: $(STAMP)
	$(PY) contrib/build_compiled.py

install: $(STAMP) $(NODE_STAMP) compiled

# Pharos on 127.0.0.1:8090 in front of three simulated engines (Ctrl-C stops it).
demo: install
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

clean:
	rm -rf $(VENV) build dist *.egg-info pharos/*.mypyc.*
