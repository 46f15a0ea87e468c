#!/bin/sh
# Interleaved A/B of parse: BEFORE = a worktree at the commit before the change, AFTER = main.
# Usage: run.sh BEFORE_TREE AFTER_TREE ROUNDS
B=$1; A=$2; R=${3:-8}
PY=/work/main/.venv/bin/python
S=$(dirname "$(readlink -f "$0")")/bench_parse_cc.py
cd /tmp
i=0
while [ $i -lt "$R" ]; do
  printf 'before %s ' "$(uptime | sed 's/.*average: //')"; PYTHONPATH=$B $PY "$S"
  printf 'after  %s ' "$(uptime | sed 's/.*average: //')"; PYTHONPATH=$A $PY "$S"
  i=$((i+1))
done
