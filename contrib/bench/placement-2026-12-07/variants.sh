#!/bin/sh
# The placement grid's four fleets, cost only, seeds 1-5, on one tree (a worktree whose
# pharos/placement.py and pharos/sched.py carry the variant): variants.sh TREE OUT
# (../placement-2026-12-02c/run_grid.sh's configurations; virtual time, so the figures do
# not depend on the machine's load, only the wall time does: ~20 s a run at load 1).
set -e
TREE=$1; OUT=$2
PY=/work/main/.venv/bin/python
cd "$TREE"
for args in "--hosts 3 --models 8" "--hosts 2 --models 8" "--hosts 4 --models 16" \
            "--kind llama-swap --hosts 3 --models 8 --rate 0.6"; do
    # shellcheck disable=SC2086
    PYTHONPATH="$TREE" $PY /work/main/.venv/bin/pharos bench placement $args \
        --policies cost --out "$OUT"
done
