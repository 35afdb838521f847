#!/bin/sh
# neighbour.sh OLD_JLM NEW_JLM MODEL TEST... - `jlm bench` t/s of two builds at 1
# and 2 threads, each without and with a busy neighbour (a `nice -n 0` shell
# loop pinned to the last CPU with taskset), interleaved run by run; medians
# per cell and the ratios new/old and 2-thread/1-thread (the machine is shared:
# only ratios of interleaved runs mean something). TEST: jlm bench options,
# e.g. `-p 128 -n 0` (prefill) or `-p 0 -n 32` (decode). Env: ROUNDS (5),
# OLD_ENV / NEW_ENV (environment assignments for each side, e.g. JLM_POOL=claim).
set -eu
old=$1 new=$2 m=$3
shift 3
test="$*"
ROUNDS=${ROUNDS:-5}
cpu=$(($(nproc) - 1))
tps() {   # env bin threads
    env $1 "$2" bench "$m" $test -r 1 -t "$3" 2>/dev/null | awk -F'|' '/ (pp|tg)[0-9]/ {gsub(/ /, "", $8); split($8, a, "±"); print a[1]}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "| neighbour | threads | old t/s (runs) | new t/s (runs) | new/old | load avg |"
echo "|---|---|---|---|---|---|"
for nb in no yes; do
    pid=""
    if [ $nb = yes ]; then
        taskset -c "$cpu" nice -n 0 sh -c 'while :; do :; done' &
        pid=$!
    fi
    for t in 1 2; do
        o="" n=""
        for r in $(seq "$ROUNDS"); do
            o="$o $(tps "${OLD_ENV:-X=}" "$old" "$t" "$@")"
            n="$n $(tps "${NEW_ENV:-X=}" "$new" "$t" "$@")"
        done
        mo=$(echo "$o" | median) mn=$(echo "$n" | median)
        echo "| $nb | $t |$o |$n | $(awk -v a="$mn" -v b="$mo" 'BEGIN {printf "%.2f", a / b}') | $(cut -d' ' -f1-3 /proc/loadavg) |"
    done
    [ -z "$pid" ] || kill "$pid"
done
