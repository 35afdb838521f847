#!/bin/sh
# ab_prefill.sh OLD_JLM NEW_JLM MODEL.gguf... - prefill (and decode) t/s of two
# jlm builds, interleaved run by run on the same files, with the median of
# each side and the ratio new/old per cell (the machine is shared: only the
# ratios of interleaved runs mean something). Env: ROUNDS (3), THREADS
# ("1 2"), TESTS ("-p 128" "-p 512": one jlm bench option set per line).
# Each run: `jlm bench MODEL TEST -n 0 -r 1 -t T`; prints one table row per cell.
set -eu
old=$1 new=$2
shift 2
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1 2}
TESTS=${TESTS:-"-p 128 -n 0
-p 512 -n 0"}
tps() {   # bin model threads test...
    b=$1 m=$2 t=$3
    shift 3
    "$b" bench "$m" "$@" -r 1 -t "$t" 2>/dev/null | awk -F'|' '/ (pp|tg)[0-9]/ {gsub(/ /, "", $8); split($8, a, "±"); print a[1]}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "| model | test | threads | old t/s (runs) | new t/s (runs) | new/old medians | load avg |"
echo "|---|---|---|---|---|---|---|"
for m in "$@"; do
    echo "$TESTS" | while read -r test; do
        [ -n "$test" ] || continue
        for t in $THREADS; do
            o="" n=""
            for r in $(seq "$ROUNDS"); do
                o="$o $(tps "$old" "$m" "$t" $test)"
                n="$n $(tps "$new" "$m" "$t" $test)"
            done
            mo=$(echo "$o" | median) mn=$(echo "$n" | median)
            echo "| $(basename "$m") | $test | $t |$o |$n | $(awk -v a="$mn" -v b="$mo" 'BEGIN {printf "%.2f", a / b}') | $(cut -d' ' -f1-3 /proc/loadavg) |"
        done
    done
done
