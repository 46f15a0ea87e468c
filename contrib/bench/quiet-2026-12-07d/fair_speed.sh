#!/usr/bin/env bash
# Issue 11 item 4 in real time at two speeds: ../fairness.sh's a-alone and a-fair (two vLLM
# doubles of 8 sequences, W6 200-600-token prompts, 20-60 output tokens, light 1/11 and heavy
# 10/11 of the rate, 1.25x what the fleet serves), at its own speed (40 ms steps, 12 req/s,
# 60 s) and at half speed (every engine time doubled: steps, prefill, 6 req/s for 120 s, so
# the same requests relative to the fleet with half the CPU a second for the doubles, Pharos
# and the load generator that share this machine's two cores). Seeds interleaved.
# Usage: fair_speed.sh OUT   (SEEDS="1 2 3 4 5"); then python3 ../fairness_table.py OUT/<speed>
set -uo pipefail
out=${1:?usage: fair_speed.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
pharos=.venv/bin/pharos
c="$out/clients"
mkdir -p "$c"
printf 'clients:\n  - {name: light, share: 0.0909}\n  - {name: heavy, share: 0}\n' > "$c/a-alone.yaml"
printf 'clients:\n  - {name: light, share: 0.0909}\n  - {name: heavy, share: 0.9091}\n' > "$c/a-fair.yaml"
run() {  # SPEED MODE SEED
    local speed=$1 mode=$2 seed=$3 k rate duration warmup timeout
    if [ "$speed" = full ]; then k=1; rate=12; duration=60; warmup=5; timeout=15
    else k=2; rate=6; duration=120; warmup=10; timeout=30; fi
    echo "$speed $mode $seed $(date -u +%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/uptime.txt"
    timeout -k 20 $(( duration + timeout + 120 )) \
        "$pharos" bench compare --engines 2 --kind vllm --engine-arg=--max-num-seqs=8 \
        --engine-arg=--decode-ms=$((40 * k)) \
        --engine-arg=--prefill-ms="$(python3 -c "print(0.1 * $k)")" \
        --engine-arg=--prefill-pair-ns="$(python3 -c "print(3.3 * $k)")" \
        --engine-arg=--prefill-fixed-ms=$((5 * k)) \
        --engine-arg=--decode-seq-us=$((100 * k)) --backend-capacity 8 \
        --workload w6 --workload-arg 'prompt_tokens=[200,600]' \
        --workload-arg 'output_tokens=[20,60]' \
        --rate "$rate" --duration "$duration" --warmup "$warmup" --timeout "$timeout" \
        --seeds "$seed" --policies cost --clients "$c/$mode.yaml" \
        --out "$out/$speed/$mode" --resume || echo "fair_speed.sh: $speed $mode $seed failed" >&2
}
for seed in ${SEEDS:-1 2 3 4 5}; do
    for speed in full half; do
        run "$speed" a-alone "$seed"
        run "$speed" a-fair "$seed"
    done
done
