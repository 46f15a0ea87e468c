#!/usr/bin/env bash
# workers: 1 against workers: 2 behind nginx (the engine) and wrk (the load): see README.md.
# Usage: run.sh [OUT.json [bench_workers_c.py args...]]
# nginx and wrk are bench-only tools (Debian: apt-get install -y nginx-light wrk), not
# dependencies of Pharos. Everything listens on 127.0.0.1 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-../../../.venv/bin/python}
out=${1:-results/throughput.json}
shift || true
for tool in nginx wrk ss; do
    command -v "$tool" >/dev/null || { echo "$tool missing: apt-get install -y nginx-light wrk" >&2; exit 2; }
done
mkdir -p "$(dirname "$out")"
stem=${out%.json}
{ echo "before: $(date -u +%FT%TZ) $(uptime)"; } > "$stem.uptime.txt"
"$PY" bench_workers_c.py --out "$out" "$@" 2> "$stem.runs.log"
{ echo "after:  $(date -u +%FT%TZ) $(uptime)"; } >> "$stem.uptime.txt"
cat "$stem.uptime.txt"
