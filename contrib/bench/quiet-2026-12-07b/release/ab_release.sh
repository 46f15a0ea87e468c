#!/usr/bin/env bash
# b8e9b7e touched Lease.release (the hot path): pharos bench overhead --floor, Klein + treq and
# Pharos only, before (BEFORE tree, by PYTHONPATH) and after (this checkout), interleaved.
# Usage: ab_release.sh BEFORE_TREE   (REPS=2; OUT=DIR: where the results go, default here)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../../.." && pwd)
out=${OUT:-$here}
mkdir -p "$out"
before=${1:?usage: ab_release.sh BEFORE_TREE}
cd "$main"
for rep in $(seq 1 "${REPS:-2}"); do
    for arm in before after; do
        echo "$arm $rep $(date -u +%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/uptime.txt"
        if [ "$arm" = before ]; then export PYTHONPATH=$before; else unset PYTHONPATH; fi
        .venv/bin/pharos bench overhead --floor --routers klein-treq,pharos --requests 2000 \
            --clients 32 --seconds 5 --rounds 3 --json > "$out/$arm-$rep.json"
    done
done
