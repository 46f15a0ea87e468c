cd /work/main
for mode in a-alone a-fair; do
timeout -k 20 200 .venv/bin/pharos bench compare --engines 2 --kind vllm --engine-arg=--max-num-seqs=8 \
        --engine-arg=--decode-ms=40 --backend-capacity 8 \
        --workload w6 --workload-arg 'prompt_tokens=[200,600]' \
        --workload-arg 'output_tokens=[20,60]' \
        --rate 12 --duration 30 --warmup 5 --timeout 15 \
        --seeds 3 --policies cost --clients /tmp/rt/$mode.yaml \
        --out /tmp/rt/$mode 2>&1 | tail -5
done
