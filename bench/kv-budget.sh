#!/usr/bin/env bash
# kv-budget.sh - bytes read a token under one --budget at the model's default
# context against -c 512 (issue 42): the KV cache takes memory only for the
# positions reached (256 at a time), so a short generation at a long context
# leaves the page frames what it leaves them at a short one and reads about
# as much. Prints each run's frames budget, KV bytes and bytes read a token
# (the pager's bytes-read over the passes: the prompt is one, each decoded
# token after the first one more), then default / -c 512.
#
# Usage: bench/kv-budget.sh [MODEL.jlm] [BUDGET=454M] [TOKENS=8] [THREADS=2]
#   no MODEL: build/bench/mkgguf synth-1b Q4_0 (context 4096), converted in a
#   temp dir. KV=TYPE: --kv TYPE for both runs (default: the CLI's, auto).
#   JLM_BIN: folder holding jlm (default build/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jlm=${JLM_BIN:-$here/../build}/jlm
model=${1:-} budget=${2:-454M} tokens=${3:-8} threads=${4:-2}
[ -x "$jlm" ] || { echo "kv-budget.sh: $jlm: not built (make all)" >&2; exit 1; }
dir=$(mktemp -d /tmp/jlm-kvb.XXXXXX)
trap 'rm -rf "$dir"' EXIT
if [ -z "$model" ]; then
    mk=$here/../build/bench/mkgguf
    [ -x "$mk" ] || { echo "kv-budget.sh: $mk: not built (make build/bench/mkgguf)" >&2; exit 1; }
    "$mk" synth-1b Q4_0 "$dir/m.gguf" > /dev/null
    "$jlm" convert "$dir/m.gguf" -o "$dir/m.jlm" > /dev/null 2>&1
    rm -f "$dir/m.gguf"
    model=$dir/m.jlm
fi
[ -r "$model" ] || { echo "kv-budget.sh: $model: cannot read" >&2; exit 1; }
kv=()
[ -n "${KV:-}" ] && kv=(--kv "$KV")

# one run: "frames KV bytes-read" from --stats
run() {
    "$jlm" run "$model" --ids 1,2,3 -n "$tokens" -t "$threads" --temp 0 --budget "$budget" --stats \
        ${kv[@]+"${kv[@]}"} "$@" 2>&1 > /dev/null |
        awk '/^memory: budget/ { for (i = 1; i <= NF; i++) { if ($i == "frames") f = $(i+1); if ($i == "KV") k = $(i+1) } }
             /^pager: / { for (i = 1; i <= NF; i++) if ($i == "bytes-read") b = $(i+1) }
             END { gsub(",", "", f); gsub(",", "", k); gsub(",", "", b); print f, k, b }'
}
passes=$tokens   # prefill + (tokens - 1) decode steps
printf '%-12s %14s %12s %16s\n' context frames KV "read/token"
declare -A per
for ctx in default 512; do
    args=()
    [ "$ctx" = default ] || args=(-c "$ctx")
    read -r f k b < <(run ${args[@]+"${args[@]}"})
    per[$ctx]=$((b / passes))
    printf '%-12s %14s %12s %16s\n' "$ctx" "$f" "$k" "${per[$ctx]}"
done
awk -v a="${per[default]}" -v b="${per[512]}" 'BEGIN { printf "ratio default / -c 512: %.3f\n", b ? a / b : 0 }'
