#!/bin/sh
# Instructions per decision (callgrind Ir) of pharos bench pick's decide row, and per pick
# alone over the decision's 64 candidates, per arm (as ab.sh's): (Ir at 1,100 calls - Ir at
# 100) / 1,000, so Python's start and the setup cancel. PYTHONHASHSEED fixed.
# usage: ir.sh BEFORE_TREE AFTER_TREE OUT_DIR
set -eu
before=$1 after=$2 out=$3
py=/work/main/.venv/bin/python
pick_ir=/work/main/contrib/bench/pick-2026-12-02c/pick_ir.py
mkdir -p "$out"
for arm in before interpreted compiled; do
    case $arm in
        before) tree=$before; flag=1 ;;
        interpreted) tree=$after; flag=0 ;;
        compiled) tree=$after; flag=1 ;;
    esac
    for what in decide pick; do
        for n in 100 1100; do
            PHAROS_COMPILED=$flag PYTHONHASHSEED=0 PYTHONPATH=$tree valgrind --tool=callgrind \
                --callgrind-out-file=/dev/null $py "$pick_ir" $what $n \
                2> "$out/$arm-$what-$n.log" >/dev/null
        done
        a=$(sed -n 's/.*I *refs: *//p' "$out/$arm-$what-100.log" | tr -d ,)
        b=$(sed -n 's/.*I *refs: *//p' "$out/$arm-$what-1100.log" | tr -d ,)
        echo "$arm $what Ir_per_call $(( (b - a) / 1000 ))" | tee -a "$out/summary.txt"
    done
done
