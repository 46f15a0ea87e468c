#!/usr/bin/env bash
# Issue 11 item 4 in real time: is the light key's excess at 10:1 the heavy clients' timeout?
# ../fairness.sh's a-alone and a-fair (two vLLM doubles of 8 sequences, 40 ms steps, W6
# 200-600-token prompts, 20-60 output tokens, light 1/11 and heavy 10/11 of 12 req/s, 1.25x
# what the fleet serves, 60 s), a-fair with each request cut 15 s after it was sent (as
# ../fairness.sh has run it: the heavy key's queue passes 13 s and most heavy requests are cut
# mid-stream) and with 120 s (no request is cut), on two trees (worktrees with their compiled
# modules; a-alone on AFTER only: pacing needs two keys). Seeds interleaved.
# Usage: fair_rt.sh BEFORE AFTER OUT   (SEEDS="1 2 3 4 5", VARIANTS="t15:before t15:after
# t120:before t120:after", DURATION=60: seconds of arrivals). The first run of this file (rt-results.tar.xz) took one tree
# with an experimental switch, PHAROS_PACE=0/1, in place of BEFORE/AFTER (see README).
set -uo pipefail
before=${1:?usage: fair_rt.sh BEFORE AFTER OUT}
after=${2:?usage: fair_rt.sh BEFORE AFTER OUT}
out=${3:?usage: fair_rt.sh BEFORE AFTER OUT}
main=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$main"
pharos=.venv/bin/pharos
c="$out/clients"
mkdir -p "$c"
printf 'clients:\n  - {name: light, share: 0.0909}\n  - {name: heavy, share: 0}\n' > "$c/a-alone.yaml"
printf 'clients:\n  - {name: light, share: 0.0909}\n  - {name: heavy, share: 0.9091}\n' > "$c/a-fair.yaml"
run() {  # MODE TIMEOUT TREE SEED OUTNAME
    local mode=$1 timeout=$2 tree=$3 seed=$4 name=$5
    echo "$name $seed $(date -u +%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/uptime.txt"
    PYTHONPATH="$tree" timeout -k 20 $(( ${DURATION:-60} + timeout + 180 )) \
        "$pharos" bench compare --engines 2 --kind vllm --engine-arg=--max-num-seqs=8 \
        --engine-arg=--decode-ms=40 --backend-capacity 8 \
        --workload w6 --workload-arg 'prompt_tokens=[200,600]' \
        --workload-arg 'output_tokens=[20,60]' \
        --rate 12 --duration "${DURATION:-60}" --warmup 5 --timeout "$timeout" \
        --seeds "$seed" --policies cost --clients "$c/$mode.yaml" \
        --out "$out/$name" --resume || echo "fair_rt.sh: $name $seed failed" >&2
}
for seed in ${SEEDS:-1 2 3 4 5}; do
    run a-alone 15 "$after" "$seed" a-alone
    for v in ${VARIANTS:-t15:before t15:after t120:before t120:after}; do
        t=${v%%:*}; which=${v##*:}
        if [ "$which" = before ]; then tree=$before; else tree=$after; fi
        run a-fair "${t#t}" "$tree" "$seed" "a-fair-$t-$which"
    done
done
echo "end $(date -u +%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/uptime.txt"
