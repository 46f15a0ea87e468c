#!/bin/sh
# Bad input, run 2: three rounds of 10,000 idle connections (timeouts.idle 20 s for the run,
# so three rounds fit; the default 60 s was run 1's), to see whether RSS grows round by round.
set -e
cd "$(dirname "$0")"
PH=${PHAROS:-../../../.venv/bin/pharos}
$PH bench overhead --bad-input --slow-clients 1000 --slow-seconds 25 --request-body 15 \
    --idle-connections 10000 --idle-used 2000 --idle 20 --idle-rounds 3 --json > badinput-2.json
