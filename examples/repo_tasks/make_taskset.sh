#!/bin/bash
# `make repo-taskset`: the task set of packages.txt in $OUT (default runs/repo_taskset): per repository
# its sdist from PyPI (src/NAME), `agentrl tasks generate` (NAME/: instances, split, Harbor dirs,
# summary.json), then train.jsonl and heldout.jsonl of them all. A repository already generated
# (NAME/summary.json) is not made again. Needs Docker (make sandbox-image) and agentrl[repo].
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/repo_taskset}
PY=${PY:-.venv/bin/python}
SEED=${SEED:-0}
MAX=${MAX:-}  # set: at most this many candidates per repository (a quicker, smaller set)
mkdir -p "$OUT/sdist" "$OUT/src"
grep -v '^#' "$here/packages.txt" | while read -r name spec include requirements max; do
    [ -n "$name" ] || continue
    if [ -f "$OUT/$name/summary.json" ]; then echo "$name: done before ($OUT/$name)" >&2; continue; fi
    "$PY" -m pip download -q --no-deps --no-binary :all: "$spec" -d "$OUT/sdist"
    sdist=$(ls "$OUT"/sdist/"${spec%%==*}"-"${spec##*==}".tar.gz "$OUT"/sdist/"${spec%%==*}"-*.tar.gz 2>/dev/null | head -1)
    rm -rf "$OUT/src/$name.tmp" && mkdir -p "$OUT/src/$name.tmp"
    tar xzf "$sdist" -C "$OUT/src/$name.tmp" && rm -rf "$OUT/src/$name" && mv "$OUT/src/$name.tmp"/* "$OUT/src/$name"
    rm -rf "$OUT/src/$name.tmp"
    "$PY" -m agentrl tasks generate --repo "$OUT/src/$name" --out "$OUT/$name" --name "$name" --seed "$SEED" \
        --include "$include" --requirements "$requirements" --max-candidates "${MAX:-$max}"
done
for split in instances train heldout; do
    cat "$OUT"/*/"$split".jsonl > "$OUT/$split.jsonl"
done
echo "{\"instances\": $(wc -l < "$OUT/instances.jsonl"), \"train\": $(wc -l < "$OUT/train.jsonl"), \"heldout\": $(wc -l < "$OUT/heldout.jsonl")}"
