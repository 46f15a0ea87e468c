#!/bin/sh
# grid.sh TREE OUT POLICIES
set -e
TREE=$1; OUT=$2; POL=$3
cd "$TREE"
for args in "--hosts 3 --models 8" "--hosts 2 --models 8" "--hosts 4 --models 16" \
            "--kind llama-swap --hosts 3 --models 8 --rate 0.6"; do
    PYTHONPATH="$TREE" /work/main/.venv/bin/python -m pharos.cli bench placement $args \
        --policies "$POL" --out "$OUT"
done
