#!/bin/sh
# Interleaved A/B of the whole decision (pharos bench pick's decide row): BEFORE and AFTER
# are two git worktrees; each round runs one of each, alternating which goes first.
# usage: ab.sh BEFORE_TREE AFTER_TREE ROUNDS OUT_DIR
set -eu
before=$1 after=$2 n=$3 out=$4
py=/work/main/.venv/bin/python
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
i=1
while [ "$i" -le "$n" ]; do
    if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
    for which in $order; do
        tree=$before; [ "$which" = after ] && tree=$after
        PYTHONPATH=$tree $py "$here/decide_ab.py" 20000 > "$out/$which-$i.json"
    done
    i=$((i + 1))
done
