#!/usr/bin/env bash
# Issue 13 item 7, restarts on main after dispatch records and shared retention (01d560e,
# a7fdebc): ../peers-2026-12-02b/run.sh's method (W1, three vLLM doubles with 600-block pools,
# 6 req/s, policy cost, 90 s with 20 s of warm-up; restarts at 30, 50 and 70 s) for
#   restart-peers-state  3 instances, peers + state file  (restart 1@30, 2@50, 0@70)
#   restart-peers        3 instances, peers only          (restart 1@30, 2@50, 0@70)
#   restart-state        1 instance,  state file only     (restart 0@30, 0@50, 0@70)
#   restart-state-three  3 instances, state file, no peers (restart 1@30, 2@50, 0@70): what
#                        ../peers-2026-12-02/run.sh called restart-state
# from the tree on PYTHONPATH. Seeds outermost, variants innermost, so drift of the machine
# falls on every variant alike. Before each run, the load average and CPU pressure go to
# OUT/load.tsv.
# Usage: run.sh OUT_DIR   (SEEDS=1,2,3 REP=1 PHAROS=.venv/bin/pharos)
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR}
pharos=${PHAROS:-.venv/bin/pharos}
seeds=${SEEDS:-1,2,3}
rep=${REP:-1}
variants=${VARIANTS:-restart-peers-state restart-peers restart-state}
three="--restart 1@30 --restart 2@50 --restart 0@70"
one="--restart 0@30 --restart 0@50 --restart 0@70"

args() {
    case $1 in
        restart-peers-state) echo --instances 3 --peers --state-file $three ;;
        restart-peers) echo --instances 3 --peers $three ;;
        restart-state) echo --instances 1 --state-file $one ;;
        restart-state-three) echo --instances 3 --state-file $three ;;
        *) echo "unknown variant $1" >&2; exit 2 ;;
    esac
}

mkdir -p "$out"
[[ -f $out/load.tsv ]] || printf 'rep\tseed\tvariant\tstart_utc\tload1\tload5\tload15\tcpu_some_avg60\tend_utc\tload1_end\n' > "$out/load.tsv"
for seed in ${seeds//,/ }; do
    for v in $variants; do
        start=$(date -u +%H:%M:%S)
        read -r l1 l5 l15 _ < /proc/loadavg
        psi=$(awk '/^some/ {sub("avg60=", "", $3); print $3}' /proc/pressure/cpu)
        # shellcheck disable=SC2046
        "$pharos" bench compare --engines 3 --kind vllm \
            --engine-arg=--max-num-seqs=64 --engine-arg=--num-gpu-blocks-override=600 \
            --backend-capacity 64 --duration 90 --warmup 20 --seeds "$seed" --policies cost \
            --workload w1 --rate 6 --workload-arg 'prompt_tokens=[2000,2000]' \
            --out "$out/rep$rep/$v" $(args "$v") || echo "run failed: rep $rep seed $seed $v" >&2
        read -r e1 _ < /proc/loadavg
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$seed" "$v" "$start" "$l1" "$l5" \
            "$l15" "$psi" "$(date -u +%H:%M:%S)" "$e1" >> "$out/load.tsv"
    done
done
