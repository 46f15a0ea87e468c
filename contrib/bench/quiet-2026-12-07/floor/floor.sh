#!/bin/sh
# Quiet-machine floor runs (issue 16 item 2 latency targets): no soak (item 4 was measured).
set -e
cd "$(dirname "$0")"
PH=${PHAROS:-../../../../.venv/bin/pharos}
for i in ${RUNS:-1 2}; do
  uptime > "floor-uptime-$i.txt"
  $PH bench overhead --floor --requests 2000 --clients 32 --seconds 5 --rounds 3 \
      --stream-tokens 500 --stream-decode-ms 2 --streams 5 --json > "floor-$i.json"
  uptime >> "floor-uptime-$i.txt"
done
