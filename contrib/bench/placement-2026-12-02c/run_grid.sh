#!/bin/sh
# One process's share of the grid: run_grid.sh TREE OUT POLICIES [CONFIG...]
#   TREE: the source tree to import pharos from (a worktree at the commit measured)
#   OUT: the output directory (each config's runs go to OUT/<config>/runs/)
#   POLICIES: comma-separated (cost, random, round-robin, loaded-first)
#   CONFIG: 2h, 3h, 4h, swap (default: all four, in that order), as placement-2026-12-02b ran them
# Seeds 1-5 (the defaults).
set -e
TREE=$1; OUT=$2; POL=$3; shift 3
[ $# -gt 0 ] || set -- 2h 3h 4h swap
PY=/work/main/.venv/bin/python  # the venv (pharos imported from TREE)
cd "$TREE"
for c in "$@"; do
    case $c in
        2h) args="--hosts 2 --models 8" ;;
        3h) args="--hosts 3 --models 8" ;;
        4h) args="--hosts 4 --models 16" ;;
        swap) args="--kind llama-swap --hosts 3 --models 8 --rate 0.6" ;;
        *) echo "unknown config $c" >&2; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    PYTHONPATH="$TREE" $PY /work/main/.venv/bin/pharos bench placement $args \
        --policies "$POL" --out "$OUT"
done
