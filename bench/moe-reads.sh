#!/usr/bin/env bash
# moe-reads.sh - a MoE model larger than its budget: decode tok/s and MB read
# a token with the expert reads of docs/pager.md ("Expert reads") against the
# same engine with them switched off by their options, rounds interleaved
# (medians), and the bound min(resident decode, O_DIRECT bandwidth / bytes a
# token), all measured in the same invocation. Also the cold start: an
# unlimited first run with the background read (the default) and with
# --no-warm. O_DIRECT reads: no page cache to drop between runs.
#
# Usage: bench/moe-reads.sh [MODEL.jlm] [TOKENS=16] [ROUNDS=3] [PCT=25]
#   no MODEL: build/bench/mkgguf moe-1g Q4_0 (n_embd 1024, 16 blocks, 32
#   experts of FFN 1024, 4 used; 0.93 GB), converted, in a temp dir.
#   THREADS (2). The budget: PCT% of the file.
# Configurations (jlm run flags):
#   off       --read-depth 1 --no-predict --no-warm   (missing experts one at a time)
#   parallel  --no-predict                            (a block's experts at once)
#   on        (the defaults: parallel reads and the next block's predicted experts)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jlm=${JLM_BIN:-$here/../build}/jlm
tokens=${2:-16} rounds=${3:-3} pct=${4:-25} threads=${THREADS:-2}
command -v jq > /dev/null || { echo "moe-reads.sh: skipped: jq not installed"; exit 0; }
[ -x "$jlm" ] || { echo "moe-reads.sh: $jlm: not built (make all)" >&2; exit 1; }
dir=$(mktemp -d /tmp/jlm-moe-reads.XXXXXX)
trap 'rm -rf "$dir"' EXIT
model=${1:-}
if [ -z "$model" ]; then
    mk=$here/../build/bench/mkgguf
    [ -x "$mk" ] || { echo "moe-reads.sh: $mk: not built (make build/bench/mkgguf)" >&2; exit 1; }
    "$mk" moe-1g Q4_0 "$dir/m.gguf" > /dev/null
    "$jlm" convert "$dir/m.gguf" -o "$dir/m.jlm" > /dev/null 2>&1
    rm -f "$dir/m.gguf"
    model=$dir/m.jlm
fi
[ -r "$model" ] || { echo "moe-reads.sh: $model: cannot read" >&2; exit 1; }
file=$(stat -c %s "$model")
budget=$((file * pct / 100))
qd=$here/../build/bench/bench_qd
bw=0
if [ -x "$qd" ]; then   # O_DIRECT, 1 MiB pieces, one read in flight (its first table row)
    bw=$("$qd" "$model" 1 256 | awk -F'|' '/^\| 1 MiB/ { gsub(/[^0-9.]/, "", $3); print $3 }')
fi
flags=(--ids 1,2,3 -n "$tokens" -t "$threads" --temp 0 --json)

# one NAME BUDGET FLAGS...: a run -> a line "NAME tok/s MB/token ids" in dir/runs
one() {
    local name=$1 b=$2
    shift 2
    "$jlm" run "$model" "${flags[@]}" --budget "$b" "$@" > "$dir/o.json" 2> "$dir/err" ||
        { echo "moe-reads.sh: $name: $(tail -1 "$dir/err")" >&2; exit 1; }
    jq -r --arg n "$name" --argjson t "$tokens" \
        '"\($n) \(.timings.decode_tps) \([.pager.arrays[].bytes_read] | add / $t / 1e6) \(.ids | map(tostring) | join(","))"' \
        "$dir/o.json" >> "$dir/runs"
}
for r in $(seq "$rounds"); do
    one off "$budget" --read-depth 1 --no-predict --no-warm
    one parallel "$budget" --no-predict
    one on "$budget"
    one cold-nowarm 0 --no-warm
    one cold-warm 0
done
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
col() { awk -v n="$1" -v c="$2" '$1 == n { print $c }' "$dir/runs" | med; }
ids=$(awk '{ print $4 }' "$dir/runs" | sort -u | wc -l)
resident=$(col cold-warm 2)
echo "model $model: $file bytes; budget $budget ($pct%); $tokens tokens, -t $threads, $rounds rounds interleaved (medians);" \
     "O_DIRECT read bandwidth $bw GB/s (bench_qd, 1 MiB, 1 in flight); ids identical across all runs: $([ "$ids" = 1 ] && echo yes || echo NO)"
printf '| config | decode tok/s | MB read a token | bound min(resident, bw / bytes) | tok/s / bound | vs off |\n|---|---|---|---|---|---|\n'
off=$(col off 2)
for n in off parallel on; do
    t=$(col $n 2) m=$(col $n 3)
    awk -v n=$n -v t="$t" -v m="$m" -v bw="$bw" -v res="$resident" -v off="$off" 'BEGIN {
        b = bw > 0 && m > 0 ? bw * 1000 / m : res; if (res < b) b = res
        printf "| %s | %.2f | %.1f | %.1f | %.2f | %.2fx |\n", n, t, m, b, t / b, t / off }'
done
t0=$(col cold-nowarm 2) t1=$(col cold-warm 2)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "cold start, unlimited: decode %.2f tok/s with the background read, %.2f with --no-warm (%.2fx)\n", b, a, b / a }'
