#!/bin/sh
# A third floor run (with the idle-CPU and net figures, added after runs 1-2), no soak.
set -e
cd "$(dirname "$0")"
PH=${PHAROS:-../../../.venv/bin/pharos}
uptime > uptime-3.txt
$PH bench overhead --floor --requests 2000 --clients 32 --seconds 5 --rounds 3 \
    --stream-tokens 500 --stream-decode-ms 2 --streams 5 --json > run-3.json
uptime >> uptime-3.txt
