#!/bin/sh
# Instructions per decision (callgrind Ir) of pharos bench pick's decide row, and per chain
# hashing of the 8,000-token chat, in each tree: (Ir at N2 calls - Ir at N1 calls) / (N2 - N1),
# so Python's start and the bench's setup cancel. PYTHONHASHSEED fixed for both trees.
# usage: ir_ab.sh OUT_DIR TREE...   (each TREE a git worktree or checkout)
set -eu
out=$1; shift
py=/work/main/.venv/bin/python
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for tree in "$@"; do
    name=$(basename "$tree")
    for what in decide chain; do
        for n in 100 1100; do
            PYTHONHASHSEED=0 PYTHONPATH=$tree valgrind --tool=callgrind \
                --callgrind-out-file=/dev/null $py "$here/pick_ir.py" $what $n \
                2> "$out/$name-$what-$n.log" >/dev/null
        done
        a=$(sed -n 's/.*I *refs: *//p' "$out/$name-$what-100.log" | tr -d ,)
        b=$(sed -n 's/.*I *refs: *//p' "$out/$name-$what-1100.log" | tr -d ,)
        echo "$name $what Ir_per_call $(( (b - a) / 1000 ))" | tee -a "$out/summary.txt"
    done
done
