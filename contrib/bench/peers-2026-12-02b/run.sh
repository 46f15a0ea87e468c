#!/usr/bin/env bash
# Issue 13 item 7, restarts only: ../peers-2026-12-02/run.sh's restart-peers-state and
# restart-peers (W1, three vLLM doubles with 600-block pools, 6 req/s, policy cost, 90 s with
# 20 s of warm-up; instance 1 restarted at 30 s, 2 at 50 s, 0 at 70 s), from the tree on
# PYTHONPATH (the roots part) and, for the *-before variants, from the tree in $BEFORE.
# Seeds outermost, variants innermost, so drift of the machine falls on every variant alike.
# Usage: run.sh OUT_DIR   (SEEDS=1,2,3 BEFORE=/path/to/tree PHAROS=.venv/bin/pharos)
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1,2,3}
variants=${VARIANTS:-restart-peers-state restart-peers restart-peers-state-before restart-peers-before}
restarts="--restart 1@30 --restart 2@50 --restart 0@70"

args() {
    case $1 in
        restart-peers-state|restart-peers-state-before) echo --instances 3 --peers --state-file $restarts ;;
        restart-peers|restart-peers-before) echo --instances 3 --peers $restarts ;;
        *) echo "unknown variant $1" >&2; exit 2 ;;
    esac
}

for seed in ${seeds//,/ }; do
    for v in $variants; do
        path=${PYTHONPATH:-}
        [[ $v == *-before ]] && path=${BEFORE:?*-before variants need BEFORE=tree}
        # shellcheck disable=SC2046
        PYTHONPATH=$path "$pharos" bench compare --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration 90 --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/$v" --resume $(args "$v")
    done
done
