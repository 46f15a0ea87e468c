#!/usr/bin/env bash
# Issue 13 item 7: W1 (sweep.sh's line: three vLLM doubles, 64 sequences, 600-block pools,
# eight 2,000-token system prompts at 6 req/s, 60 s with 20 s of warm-up), policy cost.
#   one                 1 instance
#   three-peers         3 instances, peers, the harness round robin over them
#   three-peers-before  the same from the tree in $BEFORE (PYTHONPATH), before the fix
#   three-alone         3 instances, no peers
#   restart-*           3 instances for 90 s, each restarted once (SIGTERM, drained, started
#                       again): instance 1 at 30 s, 2 at 50 s, 0 at 70 s, with or without
#                       peers and the state file
# Seeds outermost, variants innermost, so drift of the machine falls on every variant alike.
# Usage: run.sh OUT_DIR   (SEEDS=1,2,3 VARIANTS="one three-peers ..." BEFORE=/path/to/tree)
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1,2,3}
variants=${VARIANTS:-one three-peers three-alone restart-peers-state restart-peers restart-state restart-none}

restarts="--restart 1@30 --restart 2@50 --restart 0@70"

args() {
    case $1 in
        one) ;;
        three-peers|three-peers-before) echo --instances 3 --peers ;;
        three-alone) echo --instances 3 ;;
        restart-peers-state) echo --instances 3 --peers --state-file $restarts ;;
        restart-peers) echo --instances 3 --peers $restarts ;;
        restart-state) echo --instances 3 --state-file $restarts ;;
        restart-none) echo --instances 3 $restarts ;;
        *) echo "unknown variant $1" >&2; exit 2 ;;
    esac
}

for seed in ${seeds//,/ }; do
    for v in $variants; do
        duration=60
        [[ $v == restart-* ]] && duration=90
        path=${PYTHONPATH:-}
        [[ $v == *-before ]] && path=${BEFORE:?three-peers-before needs BEFORE=tree}
        # shellcheck disable=SC2046
        PYTHONPATH=$path "$pharos" bench compare --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration "$duration" --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/$v" --resume $(args "$v")
    done
done
