#!/usr/bin/env bash
# Issue 16 item 3 follow-up: W1 as ../workers-2026-12-02/run_w1.sh (three vLLM doubles, 64
# sequences, 600-block pools, eight 2,000-token system prompts at 6 req/s, 60 s with 20 s of
# warm-up, policy cost), through one Pharos with workers: 2 on the code before (a git worktree
# of the start commit, BEFORE=/work/wt-peeridle) and after (this tree), and workers: 1 after.
# Seeds outermost, variants innermost. Usage: run_w1b.sh OUT_DIR   (SEEDS=1,2)
set -euo pipefail
out=${1:?usage: run_w1b.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
python=${PYTHON:-$main/.venv/bin/python}
before=${BEFORE:-/work/wt-peeridle}
seeds=${SEEDS:-1,2}
mkdir -p "$out"; out=$(cd "$out" && pwd)
for seed in ${seeds//,/ }; do
    for v in before:2 after:2 after:1; do
        code=${v%%:*}; w=${v##*:}
        tree=$main; [ "$code" = before ] && tree=$before
        echo "$(date -u +%H:%M:%S) seed $seed $v $(cat /proc/loadavg)" >> "$out/uptime.txt"
        (cd "$tree" && PYTHONPATH="$tree" "$python" "$main/contrib/bench/workers-2026-12-02/bench_workers.py" \
            w1 --workers "$w" -- --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration 60 --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/$code-workers-$w" --resume)
    done
done
echo "$(date -u +%H:%M:%S) end $(cat /proc/loadavg)" >> "$out/uptime.txt"
