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
#   experts of FFN 1024, 4 used; 0.93 GB), converted, in a temp dir;
#   LAYERS=N: its first N blocks only (mkgguf --layers; 8: 0.47 GB).
#   THREADS (2). The budget: PCT% of the file.
#   BASE=PATH: another jlm binary (a build before a change), run with the
#   defaults in the same rounds as row `base`: before and after measured in
#   the same machine state.
# Configurations (jlm run flags):
#   off       --read-depth 1 --no-predict --no-warm   (missing experts one at a time)
#   parallel  --no-predict                            (a block's experts at once)
#   on        (the defaults: parallel reads and the next block's predicted experts)
# Where a decoded token's time goes: blocked = the engine thread's time
# waiting on reads (its own reads and the reader threads' it needed:
# timings.decode_wait_s of --json); compute = the rest of the token's time;
# read MB/s = bytes read over the run's prefill + decode time (the bandwidth
# the run got from the disk, against the O_DIRECT bandwidth bench_qd gets).
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
    "$mk" moe-1g Q4_0 "$dir/m.gguf" ${LAYERS:+--layers "$LAYERS"} > /dev/null
    "$jlm" convert "$dir/m.gguf" -o "$dir/m.jlm" > /dev/null 2>&1
    rm -f "$dir/m.gguf"
    model=$dir/m.jlm
fi
[ -r "$model" ] || { echo "moe-reads.sh: $model: cannot read" >&2; exit 1; }
file=$(stat -c %s "$model")
budget=$((file * pct / 100))
qd=$here/../build/bench/bench_qd
# the disk's O_DIRECT bandwidth, measured in every round (a shared disk
# varies): 1 MiB pieces, one read in flight (bench_qd's first table row)
diskbw() {
    [ -x "$qd" ] || return 0
    "$qd" "$model" 1 256 | awk -F'|' '/^\| 1 MiB/ { gsub(/[^0-9.]/, "", $3); print $3 }' >> "$dir/bw"
}
flags=(--ids 1,2,3 -n "$tokens" -t "$threads" --temp 0 --json)

base=${BASE:-}
[ -z "$base" ] || [ -x "$base" ] || { echo "moe-reads.sh: BASE=$base: not an executable" >&2; exit 1; }
# one NAME BIN BUDGET FLAGS...: a run -> a line "NAME tok/s MB/token ids
# blocked-ms/token compute-ms/token read-MB/s" in dir/runs (blocked: -1
# where the binary's --json has no decode_wait_s)
one() {
    local name=$1 bin=$2 b=$3
    shift 3
    "$bin" run "$model" "${flags[@]}" --budget "$b" "$@" > "$dir/o.json" 2> "$dir/err" ||
        { echo "moe-reads.sh: $name: $(tail -1 "$dir/err")" >&2; exit 1; }
    jq -r --arg n "$name" --argjson t "$tokens" '
        ([.pager.arrays[].bytes_read] | add) as $b
        | (.timings.decode_tokens - 1) as $d
        | (if .timings.decode_wait_s == null then -1 else .timings.decode_wait_s / $d * 1000 end) as $w
        | (.timings.decode_s / $d * 1000) as $tok
        | "\($n) \(.timings.decode_tps) \($b / $t / 1e6) \(.ids | map(tostring) | join(","))"
          + " \($w) \(if $w < 0 then -1 else $tok - $w end)"
          + " \($b / (.timings.prefill_s + .timings.decode_s) / 1e6)"' \
        "$dir/o.json" >> "$dir/runs"
}
for r in $(seq "$rounds"); do
    diskbw
    one off "$jlm" "$budget" --read-depth 1 --no-predict --no-warm
    one parallel "$jlm" "$budget" --no-predict
    one on "$jlm" "$budget"
    [ -z "$base" ] || one base "$base" "$budget"
    one cold-nowarm "$jlm" 0 --no-warm
    one cold-warm "$jlm" 0
done
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
col() { awk -v n="$1" -v c="$2" '$1 == n { print $c }' "$dir/runs" | med; }
ids=$(awk '{ print $4 }' "$dir/runs" | sort -u | wc -l)
bw=0
[ -s "$dir/bw" ] && bw=$(med < "$dir/bw")
resident=$(col cold-warm 2)
echo "model $model: $file bytes; budget $budget ($pct%); $tokens tokens, -t $threads, $rounds rounds interleaved (medians);" \
     "O_DIRECT read bandwidth $bw GB/s (bench_qd, 1 MiB, 1 in flight, median of the rounds: $(sort -g "$dir/bw" 2> /dev/null | tr '\n' ' ')); ids identical across all runs: $([ "$ids" = 1 ] && echo yes || echo NO)"
echo "resident decode (the unlimited run with the background read): $resident tok/s"
printf '| config | decode tok/s | MB read a token | blocked ms/token | compute ms/token | read MB/s | bound min(resident, bw / bytes) | tok/s / bound | vs off |\n|---|---|---|---|---|---|---|---|---|\n'
off=$(col off 2)
for n in off parallel on ${base:+base}; do
    t=$(col $n 2) m=$(col $n 3) w=$(col $n 5) c=$(col $n 6) rb=$(col $n 7)
    awk -v n=$n -v t="$t" -v m="$m" -v w="$w" -v c="$c" -v rb="$rb" -v bw="$bw" -v res="$resident" -v off="$off" 'BEGIN {
        b = bw > 0 && m > 0 ? bw * 1000 / m : res; if (res < b) b = res
        ws = w < 0 ? "-" : sprintf("%.1f", w); cs = w < 0 ? "-" : sprintf("%.1f", c)
        printf "| %s | %.2f | %.1f | %s | %s | %.0f | %.1f | %.2f | %.2fx |\n", n, t, m, ws, cs, rb, b, t / b, t / off }'
done
t0=$(col cold-nowarm 2) t1=$(col cold-warm 2)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "cold start, unlimited: decode %.2f tok/s with the background read, %.2f with --no-warm (%.2fx)\n", b, a, b / a }'
