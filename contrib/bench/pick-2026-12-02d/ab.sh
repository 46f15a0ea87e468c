#!/bin/sh
# Interleaved A/B/C of `pharos bench pick --only decide` (issue 10 item 6): BEFORE is a git
# worktree at the commit before the compiled policy, AFTER one with it built
# (contrib/build_compiled.py); AFTER runs twice a round, interpreted (PHAROS_COMPILED=0) and
# compiled. Each round runs the three in a rotated order.
# usage: ab.sh BEFORE_TREE AFTER_TREE ROUNDS OUT_DIR
set -eu
before=$1 after=$2 n=$3 out=$4
py=/work/main/.venv/bin/python
mkdir -p "$out"
uptime > "$out/uptime-start.txt"
run() {  # run ARM ROUND
    case $1 in
        before) tree=$before; flag=1 ;;
        interpreted) tree=$after; flag=0 ;;
        compiled) tree=$after; flag=1 ;;
    esac
    PHAROS_COMPILED=$flag PYTHONPATH=$tree $py -c \
        'import sys; from pharos.cli import main; sys.exit(main())' \
        bench pick --only decide --rounds 20000 --json > "$out/$1-$2.json"
}
i=1
while [ "$i" -le "$n" ]; do
    case $((i % 3)) in
        1) order="before interpreted compiled" ;;
        2) order="compiled before interpreted" ;;
        0) order="interpreted compiled before" ;;
    esac
    for arm in $order; do run "$arm" "$i"; done
    uptime >> "$out/uptime-rounds.txt"
    i=$((i + 1))
done
uptime > "$out/uptime-end.txt"
