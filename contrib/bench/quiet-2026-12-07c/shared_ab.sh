#!/usr/bin/env bash
# Issue 10 item 2 in real time, the KV room fix before and after: ../shared-prefix.sh (three
# vLLM doubles, 250-block pools, eight 500-token system prompts, w1 at 20 req/s, serial and
# burst starts, KV usage as vLLM counts it), production-stack's prefix-aware and cost on this
# tree, and cost on BEFORE (a worktree of the tree before the fix, with the same compiled
# policy), seeds interleaved so the machine's drift falls on all three alike.
# Usage: shared_ab.sh BEFORE_WORKTREE   (SEEDS=1,2,3,4,5)
set -uo pipefail
before=${1:?usage: shared_ab.sh BEFORE_WORKTREE}
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
cd "$main"
SEEDS=${SEEDS:-1,2,3,4,5}
for seed in ${SEEDS//,/ }; do
    echo "seed $seed start $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/shared-uptime.txt"
    SEEDS=$seed POLICIES=prefix-aware,cost bash contrib/bench/shared-prefix.sh "$here/shared/after"
    SEEDS=$seed POLICIES=cost PYTHONPATH="$before" bash contrib/bench/shared-prefix.sh "$here/shared/before"
done
echo "end $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/shared-uptime.txt"
