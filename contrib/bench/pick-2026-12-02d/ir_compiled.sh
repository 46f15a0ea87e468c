#!/bin/sh
# ir.sh's compiled arm alone, its four runs two at a time (the full ir.sh ran out of time after
# the before arm: each callgrind run took 3-5 minutes on the loaded VM).
# usage: ir_compiled.sh AFTER_TREE OUT_DIR
set -eu
after=$1 out=$2
py=/work/main/.venv/bin/python
pick_ir=/work/main/contrib/bench/pick-2026-12-02c/pick_ir.py
one() {  # one WHAT N
    PHAROS_COMPILED=1 PYTHONHASHSEED=0 PYTHONPATH=$after valgrind --tool=callgrind \
        --callgrind-out-file=/dev/null $py "$pick_ir" $1 $2 2> "$out/compiled-$1-$2.log" >/dev/null
}
for what in decide pick; do
    one $what 100 & one $what 1100 & wait
    a=$(sed -n 's/.*I *refs: *//p' "$out/compiled-$what-100.log" | tr -d ,)
    b=$(sed -n 's/.*I *refs: *//p' "$out/compiled-$what-1100.log" | tr -d ,)
    echo "compiled $what Ir_per_call $(( (b - a) / 1000 ))" | tee -a "$out/summary.txt"
done
