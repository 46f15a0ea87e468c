#!/bin/sh
# Interleaved runs of `pharos bench overhead`: fd2ac38 plain, HEAD plain, HEAD --observe, the
# order rotated each round. MODE=free: as the bench runs (no pinning). MODE=pinned: the router
# (twistd) alone on core 1, the client and the vLLM double on core 0, through a copy of the
# venv's bin whose twistd and pharos are taskset wrappers (PIN=/tmp/measpin).
# VARIANTS (default "base head observe"): also "log" (decision log alone) and "live" (live map
# reader alone), which need attribution.patch applied to the HEAD tree's bench harness.
# Usage (from this directory, after the worktrees in README.md): MODE=free|pinned ROUNDS=N OUT=dir [VARIANTS="..."] run.sh
set -e
VENV=/work/main/.venv
PIN=/tmp/measpin
OUT=${OUT:-.}
for r in $(seq 1 "$ROUNDS"); do
  order=${VARIANTS:-base head observe}
  i=1
  while [ $i -lt $r ]; do  # rotate: each round starts one variant later
    order="${order#* } ${order%% *}"; i=$((i + 1))
  done
  for v in $order; do
    case $v in
      base) tree=/work/meas-base; flag= ;;
      head) tree=/work/meas-head; flag= ;;
      observe) tree=/work/meas-head; flag=--observe ;;
      log|live) tree=/work/meas-head; flag=--observe ;;
    esac
    f=$OUT/$MODE-$v-r$r.json
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    case $v in log|live) export MEAS_OBSERVE_PART=$v ;; *) unset MEAS_OBSERVE_PART ;; esac
    if [ "$MODE" = pinned ]; then
      (cd /tmp && PYTHONPATH=$tree taskset -c 0 $PIN/bin/python $VENV/bin/pharos bench overhead --json $flag) > "$f"
    else
      (cd /tmp && PYTHONPATH=$tree $VENV/bin/pharos bench overhead --json $flag) > "$f"
    fi
    echo "$MODE r$r $v load_before=[$load] cpu=$(grep -o '"pharos_cpu_ms_per_request": [0-9.]*' "$f" | cut -d' ' -f2) $(date +%H:%M:%S)" | tee -a "$OUT/runs.log"
  done
done
