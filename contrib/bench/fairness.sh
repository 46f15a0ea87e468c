#!/usr/bin/env bash
# Issue 11 item 4: the two-level fair queue on a saturated simulated fleet. Two vLLM-like
# doubles of 8 sequences each (Pharos told so: capacity 8, so requests past 16 wait in Pharos's
# fair queue, not in an engine), 40 ms a decode step, W6 with 200-600-token prompts and 20-60
# output tokens: about 9.5 requests a second fill the fleet.
#  (a) 10:1 load: `light` sends 1/11 and `heavy` 10/11 of 12 req/s (1.25x what the fleet
#      serves). Runs: light alone (same light requests, heavy sends none), both through Pharos
#      with a key each (fair), both as one key (FIFO: no fairness), and the harness's round robin
#      straight to the engines (the engines' own FIFO queues).
#  (b) 100 keys of tenant `a` (10 req/s together) against one key of tenant `b` (6 req/s), same
#      weights, 16 req/s in all (1.7x): with the two tenants (fair), with the same 101 keys in
#      one tenant (key-level fairness only), as one key (FIFO), and round robin to the engines.
# Seeds outermost, every mode of a seed back to back. Each request is cut TIMEOUT s after its
# scheduled time, each compare is killed past its bound. Usage: contrib/bench/fairness.sh OUT
# (then: python3 contrib/bench/fairness_table.py OUT)
set -uo pipefail
out=${1:?usage: fairness.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1 2 3}
duration=${DURATION:-30}
warmup=${WARMUP:-5}
timeout=${TIMEOUT:-15}
mkdir -p "$out/clients"

c="$out/clients"
cat > "$c/a-alone.yaml" <<'YAML'
clients:
  - {name: light, share: 0.0909}
  - {name: heavy, share: 0}
YAML
cat > "$c/a-fair.yaml" <<'YAML'
clients:
  - {name: light, share: 0.0909}
  - {name: heavy, share: 0.9091}
YAML
cat > "$c/a-onekey.yaml" <<'YAML'
clients:
  - {name: light, share: 0.0909, key: shared}
  - {name: heavy, share: 0.9091, key: shared}
YAML
cat > "$c/b-tenants.yaml" <<'YAML'
tenants:
  - {name: a, weight: 1}
  - {name: b, weight: 1}
clients:
  - {name: a, share: 0.625, count: 100, tenant: a}
  - {name: b, share: 0.375, tenant: b}
YAML
cat > "$c/b-keys.yaml" <<'YAML'
clients:
  - {name: a, share: 0.625, count: 100}
  - {name: b, share: 0.375}
YAML
cat > "$c/b-onekey.yaml" <<'YAML'
clients:
  - {name: a, share: 0.625, key: shared}
  - {name: b, share: 0.375, key: shared}
YAML

# one mode, one seed: MODE RATE POLICIES
run() {
    local mode=$1 rate=$2 policies=$3 seed=$4 n
    n=$(tr -cd , <<<"$policies" | wc -c)
    timeout -k 20 $(( (n + 1) * (duration + timeout + 60) )) \
        "$pharos" bench compare --engines 2 --kind vllm --engine-arg=--max-num-seqs=8 \
        --engine-arg=--decode-ms=40 --backend-capacity 8 \
        --workload w6 --workload-arg 'prompt_tokens=[200,600]' \
        --workload-arg 'output_tokens=[20,60]' \
        --rate "$rate" --duration "$duration" --warmup "$warmup" --timeout "$timeout" \
        --seeds "$seed" --policies "$policies" --clients "$c/$mode.yaml" \
        --out "$out/$mode" --resume || echo "fairness.sh: $mode seed $seed failed" >&2
}

# MODES (default all) picks modes by name; FAIR_POLICIES replaces a-fair's cost,round-robin.
modes=" ${MODES:-a-alone a-fair a-onekey b-tenants b-keys b-onekey} "
want() { [[ $modes == *" $1 "* ]]; }
for seed in $seeds; do
    want a-alone && run a-alone 12 cost "$seed"
    want a-fair && run a-fair 12 "${FAIR_POLICIES:-cost,round-robin}" "$seed"
    want a-onekey && run a-onekey 12 cost "$seed"
    want b-tenants && run b-tenants 16 cost,round-robin "$seed"
    want b-keys && run b-keys 16 cost "$seed"
    want b-onekey && run b-onekey 16 cost "$seed"
done
