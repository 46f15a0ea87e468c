#!/usr/bin/env bash
# fair_batch.py on two trees, seeds and both timeouts (0: no request cut; 15: as the real-time
# bench cuts), two runs at a time. Usage: batch_ab.sh BEFORE_TREE AFTER_TREE OUT  (SEEDS)
set -uo pipefail
before=${1:?}; after=${2:?}; out=${3:?}
here=$(cd "$(dirname "$0")" && pwd)
py=$(cd "$here/../../.." && pwd)/.venv/bin/python
mkdir -p "$out"
for seed in ${SEEDS:-1 2 3 4 5 6 7 8 9 10}; do
    for t in 0 15; do
        PYTHONPATH=$before "$py" "$here/fair_batch.py" "$seed" 120 --timeout $t --no-tenants \
            > "$out/before-t$t-seed$seed.json" &
        PYTHONPATH=$after "$py" "$here/fair_batch.py" "$seed" 120 --timeout $t --no-tenants \
            > "$out/after-t$t-seed$seed.json"
        wait
    done
done
