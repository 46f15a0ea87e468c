#!/bin/sh
# pharos bench overhead --floor, repeated (the 2-core VM is shared: figures are noisy).
# Each run: 2,000 one-client requests per path alternating; 3 rounds x 5 s at 32 clients;
# a 500-token stream 5 times per path at 2 ms/token; a 35,000-request soak through Pharos.
set -e
cd "$(dirname "$0")"
PH=${PHAROS:-../../../.venv/bin/pharos}
for i in ${RUNS:-1 2}; do
  uptime > "uptime-$i.txt"
  $PH bench overhead --floor --requests 2000 --clients 32 --seconds 5 --rounds 3 \
      --stream-tokens 500 --stream-decode-ms 2 --streams 5 --soak 35000 --json > "run-$i.json"
  uptime >> "uptime-$i.txt"
done
