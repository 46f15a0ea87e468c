#!/usr/bin/env bash
# Issue 10 item 2 in real time, a change before and after: ../shared-prefix.sh (three vLLM
# doubles, 250-block pools, eight 500-token system prompts, w1 at 20 req/s, serial and burst
# starts, KV usage as vLLM counts it), production-stack's prefix-aware and cost on AFTER, and
# cost on BEFORE (worktrees, each with its compiled policy), seeds interleaved so the
# machine's drift falls on all three alike. Both trees run from worktrees, so the checkout
# this script lives in can change while it runs.
# Usage: shared_ab.sh BEFORE_WORKTREE AFTER_WORKTREE   (SEEDS=1,2,3,4,5)
set -uo pipefail
before=${1:?usage: shared_ab.sh BEFORE_WORKTREE AFTER_WORKTREE}
after=${2:?usage: shared_ab.sh BEFORE_WORKTREE AFTER_WORKTREE}
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../../.." && pwd)
cd "$main"
SEEDS=${SEEDS:-1,2,3,4,5}
for seed in ${SEEDS//,/ }; do
    echo "seed $seed start $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/shared-uptime.txt"
    SEEDS=$seed POLICIES=prefix-aware,cost PYTHONPATH="$after" bash "$after/contrib/bench/shared-prefix.sh" "$here/shared/after"
    SEEDS=$seed POLICIES=cost PYTHONPATH="$before" bash "$before/contrib/bench/shared-prefix.sh" "$here/shared/before"
done
echo "end $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$here/shared-uptime.txt"
