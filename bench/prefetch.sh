#!/usr/bin/env bash
# prefetch.sh - decode speed under a budget with the pager's block prefetch on
# and off (docs/pager.md, Prefetch), interleaved in one run, medians and ratio.
# Usage: bench/prefetch.sh MODEL.jlm BUDGET [ROUNDS=5] [TOKENS=16] [THREADS=2]
# BUDGET as jlm bench --budget takes it (bytes, K/M/G). Reads are O_DIRECT (jlm
# bench's default), so every page-in reaches the disk whatever the page cache
# holds. JLM_BIN: the folder holding jlm (default build/).
set -euo pipefail
model=${1:?usage: bench/prefetch.sh MODEL.jlm BUDGET [ROUNDS] [TOKENS] [THREADS]}
budget=${2:?usage: bench/prefetch.sh MODEL.jlm BUDGET [ROUNDS] [TOKENS] [THREADS]}
rounds=${3:-5} tokens=${4:-16} threads=${5:-2}
jlm=${JLM_BIN:-$(dirname "$0")/../build}/jlm
[ -r "$model" ] || { echo "prefetch.sh: $model: cannot read" >&2; exit 1; }
out=$(mktemp /tmp/jlm-prefetch.XXXXXX)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
    for mode in off on; do
        flag=; [ $mode = off ] && flag=--no-prefetch
        "$jlm" bench "$model" -p 0 -n "$tokens" -r 1 -t "$threads" --budget "$budget" -o csv $flag |
            awk -F, -v m=$mode 'NR > 1 { print m, $8, $10, $11, $12 }' >> "$out"
    done
done
# mode t/s page-ins MiB wait-ms: medians per mode
med() { awk -v m="$1" -v c="$2" '$1 == m { print $c }' "$out" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '| prefetch | tg%s t/s (median of %s) | page-ins/rep | read MiB/rep | wait ms/rep |\n|---|---|---|---|---|\n' "$tokens" "$rounds"
for mode in off on; do
    printf '| %s | %.3f | %s | %.1f | %.1f |\n' $mode "$(med $mode 2)" "$(med $mode 3)" "$(med $mode 4)" "$(med $mode 5)"
done
awk -v a="$(med on 2)" -v b="$(med off 2)" 'BEGIN { printf "decode ratio on/off: %.3f\n", a / b }'
