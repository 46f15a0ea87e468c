#!/usr/bin/env bash
# Quiet-window measurements after quiet-2026-12-07 (same VM, 2026-12-07), one after another:
# (1) issue 16 item 3: workers: 2 with each listen mode (PHAROS_WORKERS_LISTEN reuseport, the
#     default, against shared: one socket, one accept per wake-up) and one worker, keep-alive
#     and a new connection per request (../workers-2026-12-02c/run.sh, nginx + wrk);
# (2) issue 10 item 2: shared prefixes on small caches, both starts (../shared-prefix.sh),
#     production-stack's prefix-aware against cost, KV usage as vLLM counts it (seeds 1-5),
#     then as the cache's fill (seeds 1-3);
# (3) issue 16 item 3: W1's hit rate with workers: 2 against 1 (../workers-2026-12-02/run_w1.sh,
#     seeds 1-5). Each part logs the load before and after.
# Usage: run_all.sh [PARTS...]   (workers shared w1 fill; default all four, in that order)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
cd "$main"
echo "HEAD $(git rev-parse HEAD) $(nproc) cores" >> "$here/uptime.txt"
for part in ${*:-workers shared w1 fill}; do
    echo "== $part start $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/uptime.txt"
    case $part in
        workers)
            PYTHON="$main/.venv/bin/python" bash contrib/bench/workers-2026-12-02c/run.sh \
                "$here/workers/listen.json" --rounds 4 --seconds 8 --warmup 2 \
                --direct-seconds 2 --variants 1,2,2:shared > "$here/workers.log" 2>&1 ;;
        shared)
            SEEDS=1,2,3,4,5 POLICIES=prefix-aware,cost \
                bash contrib/bench/shared-prefix.sh "$here/shared" > "$here/shared.log" 2>&1 ;;
        w1)
            mkdir -p "$here/w1"
            SEEDS=1,2,3,4,5 PYTHON="$main/.venv/bin/python" \
                bash contrib/bench/workers-2026-12-02/run_w1.sh "$here/w1" > "$here/w1.log" 2>&1 ;;
        fill)
            KV=fill SEEDS=1,2,3 POLICIES=prefix-aware,cost \
                bash contrib/bench/shared-prefix.sh "$here/shared" > "$here/fill.log" 2>&1 ;;
    esac
    echo "== $part end $(date -u +%FT%TZ) rc=$? $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/uptime.txt"
done
