#!/usr/bin/env bash
# Quiet-window measurements on main's HEAD (2026-12-07, a fresh VM), one after another so that
# nothing of ours overlaps: (1) issue 13's 1 -> 3 instances on W1 (peers-2026-12-02c/run.sh,
# variants one and three-peers, seeds 1-5); (2) issue 11's light key at 10:1 in real time
# (fairness.sh, a-alone and a-fair, seeds 1-5); (3) issue 16's workers: 2 against 1
# (workers-2026-12-02c, nginx + wrk). Each part logs uptime before and after.
# (4) issue 10 item 6's decision time (pharos bench pick); (5) issue 16's floor runs
# (../quiet-2026-12-02b/floor.sh: pharos bench overhead --floor, three runs).
# Usage: run_all.sh [PARTS...]   (peers fair workers pick floor; default the first three:
# pick and floor were run by hand after them, in that order, as the same commands)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
cd "$main"
parts=${*:-peers fair workers}
echo "HEAD $(git rev-parse HEAD) $(nproc) cores" >> "$here/uptime.txt"
for part in $parts; do
    echo "== $part start $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/uptime.txt"
    case $part in
        peers)
            VARIANTS="one three-peers" SEEDS=1,2,3,4,5 PHAROS=.venv/bin/pharos \
                bash contrib/bench/peers-2026-12-02c/run.sh "$here/peers" > "$here/peers.log" 2>&1 ;;
        fair)
            MODES="a-alone a-fair" FAIR_POLICIES=cost SEEDS="1 2 3 4 5" DURATION=60 \
                bash contrib/bench/fairness.sh "$here/fair" > "$here/fair.log" 2>&1 ;;
        workers)
            PYTHON="$main/.venv/bin/python" bash contrib/bench/workers-2026-12-02c/run.sh \
                "$here/workers/throughput.json" --rounds 6 --seconds 8 --warmup 2 \
                --direct-seconds 2 --variants 1,2,2x1 > "$here/workers.log" 2>&1 ;;
        pick)
            mkdir -p "$here/pick"
            for i in 1 2 3 4 5; do .venv/bin/pharos bench pick --only decide --rounds 20000 \
                --json > "$here/pick/decide-$i.json"; done
            for i in 1 2; do .venv/bin/pharos bench pick --rounds 20000 --json \
                > "$here/pick/full-$i.json"; done ;;
        floor)
            RUNS="1 2 3" sh contrib/bench/quiet-2026-12-02b/floor.sh "$here/floor" \
                > "$here/floor/floor.log" 2>&1 ;;
    esac
    echo "== $part end $(date -u +%FT%TZ) rc=$? $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/uptime.txt"
done
