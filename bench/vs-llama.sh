#!/bin/sh
# vs-llama.sh - `jlm bench` against llama.cpp's `llama-bench` on the same GGUFs.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/vs-llama.sh
#
# Model: mkgguf's synth-1b (Llama-3.2-1B blocks, vocab 512, 975 M parameters;
# PRESET=moe-32x4 for the MoE preset: 32 experts of 512 rows, 4 used, 8 layers)
# written once in F16, then quantized by llama.cpp's own llama-quantize into
# Q4_0, Q4_K_M, Q8_0 and MXFP4 (--pure MXFP4_MOE: every 2-D weight MXFP4), so
# both engines read the very same GGUF; jlm reads it converted by `jlm convert`.
# Per round, per type, per thread count: one `jlm bench -r 1` and one
# `llama-bench -r 1` (each with its own warm-up), alternating, so load from
# other tenants hits both alike. The table gives the median over the rounds of
# each cell, llama.cpp first, and jlm / llama.cpp. The last column is jlm's
# decode against the bandwidth roofline of the same round: the container's
# bytes read once per token at the memory probe's GB/s for that thread count
# (`bench_kernels -P`, once per round; the median of the rounds' ratios).
#
# Files (~8 GiB in all: the F16 source, four GGUFs, four containers) go to
# $VS_DIR (default /tmp/jlm-vs-llama), never into the repository, and are
# reused by later runs. Knobs (environment): ROUNDS (3), PP (128), TG (64),
# DEPTH (0: the tests start from that many cached positions, -d of both
# tools; the roofline column still counts the weights only, not the cache
# each token also reads; on a MoE preset it counts every expert, so it is no
# roofline there), PRESET (synth-1b), THREADS ("1 2"), TYPES ("Q4_0 Q4_K_M Q8_0 MXFP4"), JLM (build/jlm),
# MKGGUF (build/bench/mkgguf), BK (build/bench/bench_kernels; missing: no
# roofline column). LLAMA_BIN unset: one line, exit 0.
set -eu

if [ -z "${LLAMA_BIN:-}" ]; then
    echo "vs-llama: LLAMA_BIN is unset (llama.cpp's build/bin with llama-bench and llama-quantize): skipped"
    exit 0
fi
ROUNDS=${ROUNDS:-3}
PP=${PP:-128}
TG=${TG:-64}
DEPTH=${DEPTH:-0}
THREADS=${THREADS:-"1 2"}
TYPES=${TYPES:-"Q4_0 Q4_K_M Q8_0 MXFP4"}
PRESET=${PRESET:-synth-1b}
JLM=${JLM:-build/jlm}
MKGGUF=${MKGGUF:-build/bench/mkgguf}
BK=${BK:-build/bench/bench_kernels}
DIR=${VS_DIR:-/tmp/jlm-vs-llama}
LB="$LLAMA_BIN/llama-bench"
LQ="$LLAMA_BIN/llama-quantize"
for x in "$JLM" "$MKGGUF" "$LB" "$LQ"; do
    [ -x "$x" ] || { echo "vs-llama: $x: not an executable (make all build/bench/mkgguf; LLAMA_BIN)" >&2; exit 1; }
done
mkdir -p "$DIR"
export XDG_CACHE_HOME="$DIR/cache"   # jlm never converts into ~/.cache here

# ---------------------------------------------------------------- models
src="$DIR/$PRESET.F16.gguf"
if [ ! -s "$src" ]; then
    echo "vs-llama: writing $src" >&2
    "$MKGGUF" "$PRESET" F16 "$src.tmp" && mv "$src.tmp" "$src"
fi
for t in $TYPES; do
    g="$DIR/$PRESET.$t.gguf"
    if [ ! -s "$g" ]; then
        echo "vs-llama: llama-quantize $t" >&2
        case $t in
        MXFP4) "$LQ" --pure "$src" "$g.tmp" MXFP4_MOE 2 >"$DIR/quantize-$t.log" 2>&1 ;;
        *)     "$LQ" "$src" "$g.tmp" "$t" 2 >"$DIR/quantize-$t.log" 2>&1 ;;
        esac || { echo "vs-llama: llama-quantize $t failed: $DIR/quantize-$t.log" >&2; exit 1; }
        mv "$g.tmp" "$g"
    fi
    j="$DIR/$PRESET.$t.jlm"
    if [ ! -s "$j" ] || [ "$g" -nt "$j" ]; then
        echo "vs-llama: jlm convert $t" >&2
        "$JLM" convert "$g" -o "$j" >/dev/null
    fi
done

# ---------------------------------------------------------------- rounds
# results: one line per measurement: tool type threads test t/s
res="$DIR/results.txt"
: >"$res"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    if [ -x "$BK" ]; then   # "probe (AVX2 read) 1 thread X GB/s, 2 threads Y GB/s"
        "$BK" -P -t 1 | sed -n 's/.* 1 thread \([0-9.]*\) GB\/s, 2 threads \([0-9.]*\) GB\/s.*/\1 \2/p' |
            awk -v r="$r" '{ print "probe", r, 1, "bw", $1; print "probe", r, 2, "bw", $2 }' >>"$res"
    fi
    for t in $TYPES; do
        for th in $THREADS; do
            echo "vs-llama: round $r/$ROUNDS $t -t $th" >&2
            # jlm bench's markdown table: | model | size | params | threads | budget | test | t/s | ...
            "$JLM" bench "$DIR/$PRESET.$t.jlm" -p "$PP" -n "$TG" -d "$DEPTH" -r 1 -t "$th" |
                awk -F'|' -v t="$t" -v th="$th" -v r="$r" '$7 ~ /^ *(pp|tg)[0-9]+( @ d[0-9]+)? *$/ {
                    split($7, w, " "); test = w[1]; split($8, v, "±"); gsub(/ /, "", v[1]);
                    print "jlm", t, th, test, v[1], r }' >>"$res"
            # llama-bench -o jsonl: one object per test with n_prompt, n_gen, avg_ts
            "$LB" -m "$DIR/$PRESET.$t.gguf" -p "$PP" -n "$TG" -d "$DEPTH" -r 1 -t "$th" -o jsonl 2>/dev/null |
                sed -n 's/.*"n_prompt": *\([0-9]*\).*"n_gen": *\([0-9]*\).*"avg_ts": *\([0-9.e+-]*\).*/\1 \2 \3/p' |
                awk -v t="$t" -v th="$th" '{ test = $1 > 0 ? "pp" $1 : "tg" $2; print "llama", t, th, test, $3 }' >>"$res"
        done
    done
    r=$((r + 1))
done

# ---------------------------------------------------------------- table
mid() {   # numbers on stdin, one a line -> their median, or "-" when none
    sort -g | awk '{ v[NR] = $1 } END { if (!NR) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
                                       else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
median() {   # tool type threads test -> the median t/s, or "-" when none
    awk -v a="$1" -v b="$2" -v c="$3" -v d="$4" '$1 == a && $2 == b && $3 == c && $4 == d { print $5 }' "$res" | mid
}
cell() {   # type threads test -> "llama vs jlm (ratio x)"
    l=$(median llama "$1" "$2" "$3")
    j=$(median jlm "$1" "$2" "$3")
    awk -v l="$l" -v j="$j" 'BEGIN { if (l == "-" || j == "-" || l + 0 == 0) printf "%s vs %s", l, j;
                                     else printf "%.1f vs %.1f (%.2fx)", l, j, j / l }'
}
at=""
[ "$DEPTH" -gt 0 ] && at=" @ d$DEPTH"
echo "$PRESET (mkgguf), tok/s, llama.cpp vs jlm (jlm / llama.cpp), median of $ROUNDS interleaved rounds${at:+, tests from $DEPTH cached positions}"
echo
roof() {   # type threads -> jlm decode / (probe GB/s / container bytes), median over rounds
    bytes=$(stat -c %s "$DIR/$PRESET.$1.jlm")
    awk -v t="$1" -v th="$2" -v tg="tg$TG" -v B="$bytes" '
        $1 == "probe" && $3 == th { bw[$2] = $5 }
        $1 == "jlm" && $2 == t && $3 == th && $4 == tg { ts[$6] = $5 }
        END { for (r in ts) if (bw[r] > 0) print ts[r] / (bw[r] * 1e9 / B) }' "$res" |
        mid | awk '{ if ($1 == "-") print; else printf "%.2f\n", $1 }'
}
echo "| type | threads | prefill pp$PP$at | decode tg$TG$at | jlm decode / roofline |"
echo "|---|---|---|---|---|"
for t in $TYPES; do
    for th in $THREADS; do
        echo "| $t | $th | $(cell "$t" "$th" "pp$PP") | $(cell "$t" "$th" "tg$TG") | $(roof "$t" "$th") |"
    done
done
