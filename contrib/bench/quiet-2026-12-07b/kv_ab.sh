#!/usr/bin/env bash
# Is fddf860 (KV headroom) what made cost's p99 worse on the shared-prefix serial cells?
# cost alone, KV usage as vLLM counts it, start serial, seeds 2 and 4, the main tree (HEAD)
# against the same tree with fddf860 reverted (NOKV, a worktree: git worktree add DIR HEAD;
# git -C DIR revert --no-commit fddf860), interleaved, REPS repetitions. ARMS names the arms
# (default "head nokv"): nokv runs NOKV_TREE, any other the main tree as it is (``fix``: the
# main tree with the change that gives a finished request's KV back, run after the others).
# Usage: kv_ab.sh NOKV_TREE   (REPS=2 ARMS="head nokv" STARTS=serial SEEDS=2,4)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
nokv=${1:?usage: kv_ab.sh NOKV_TREE}
cd "$main"
for rep in $(seq 1 "${REPS:-2}"); do
    for arm in ${ARMS:-head nokv}; do
        echo "$arm rep $rep $(date -u +%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/ab-uptime.txt"
        if [ "$arm" = nokv ]; then export PYTHONPATH=$nokv; else unset PYTHONPATH; fi
        SEEDS=${SEEDS:-2,4} POLICIES=cost STARTS=${STARTS:-serial} \
            bash contrib/bench/shared-prefix.sh "$here/ab/$arm-rep$rep" >> "$here/ab.log" 2>&1
    done
done
unset PYTHONPATH
