#!/bin/sh
# Quiet-machine floor runs (issue 16 item 2 latency targets): no soak (item 4 was measured).
# Usage: floor.sh [OUT_DIR]   (default: this directory; RUNS="1 2" names the runs)
set -e
cd "$(dirname "$0")"
PH=${PHAROS:-$(pwd)/../../../.venv/bin/pharos}
out=${1:-.}
mkdir -p "$out"
for i in ${RUNS:-1 2}; do
  uptime > "$out/floor-uptime-$i.txt"
  $PH bench overhead --floor --requests 2000 --clients 32 --seconds 5 --rounds 3 \
      --stream-tokens 500 --stream-decode-ms 2 --streams 5 --json > "$out/floor-$i.json"
  uptime >> "$out/floor-uptime-$i.txt"
done
