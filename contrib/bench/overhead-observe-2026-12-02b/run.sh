#!/bin/sh
# Interleaved before/after runs of `pharos bench overhead` (plain and --observe), the order
# rotated each round. Before = /work/obsfix-base (0e75a7f), after = /work/obsfix-after
# (0e75a7f + this change's pharos/journal.py, pharos/obs/decisions.py, pharos/obs/live.py).
# Usage: sh run.sh ROUNDS OUTDIR [FIRST_ROUND]
set -e
rounds=${1:-6}; out=${2:-.}; first=${3:-1}
venv=/work/main/.venv/bin
run() {  # variant round
  case $1 in
    base-plain) tree=/work/obsfix-base; flag= ;;
    base-observe) tree=/work/obsfix-base; flag=--observe ;;
    after-plain) tree=/work/obsfix-after; flag= ;;
    after-observe) tree=/work/obsfix-after; flag=--observe ;;
  esac
  echo "$(date -u +%H:%M:%S) r$2 $1 load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.log"
  PYTHONPATH=$tree $venv/pharos bench overhead --json $flag > "$out/$1-r$2.json"
}
set -- base-plain base-observe after-plain after-observe
r=$first
while [ $r -le $rounds ]; do
  # rotate: start at variant (r-1) mod 4
  k=$(( (r - 1) % 4 )); j=0
  for v in "$@" "$@"; do
    if [ $j -ge $k ] && [ $j -lt $((k + 4)) ]; then run "$v" "$r"; fi
    j=$((j+1))
  done
  r=$((r+1))
done
