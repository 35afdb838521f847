#!/bin/sh
# neighbour.sh OLD_JLM NEW_JLM MODEL TEST... - `jlm bench` t/s of two builds at 1
# and 2 threads, each without and with a busy neighbour (a `nice -n 0` shell
# loop pinned to the last CPU with taskset). A round runs the four cells of one
# neighbour state back to back (old 1, new 1, old 2, new 2 threads), so each
# round's 2-thread / 1-thread ratio compares runs of the same machine state;
# the table gives the runs, the medians, new/old, and per build the ratio of
# each round's 2-thread run to its 1-thread run (the machine is shared: only
# ratios of interleaved runs mean something). TEST: jlm bench options, e.g.
# `-p 128 -n 0` (prefill) or `-p 0 -n 32` (decode). Env: ROUNDS (5), REPS
# (jlm bench -r, 1), OLD_ENV / NEW_ENV (environment assignments for each side,
# e.g. JLM_POOL=claim).
set -eu
old=$1 new=$2 m=$3
shift 3
test="$*"
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-1}
cpu=$(($(nproc) - 1))
tps() {   # env bin threads
    env $1 "$2" bench "$m" $test -r "$REPS" -t "$3" 2>/dev/null | awk -F'|' '/ (pp|tg)[0-9]/ {gsub(/ /, "", $8); split($8, a, "±"); print a[1]}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ratios() { # "a1 a2 ..." "b1 b2 ...": b_i / a_i, two decimals
    echo "$1|$2" | awk -F'|' '{n = split($1, a, " "); split($2, b, " "); for (i = 1; i <= n; i++) printf "%s%.2f", (i > 1 ? " " : ""), b[i] / a[i]}'
}
echo "| neighbour | threads | old t/s (runs) | new t/s (runs) | new/old | load avg |"
echo "|---|---|---|---|---|---|"
summary=""
for nb in no yes; do
    pid=""
    if [ $nb = yes ]; then
        taskset -c "$cpu" nice -n 0 sh -c 'while :; do :; done' &
        pid=$!
    fi
    o1="" n1="" o2="" n2=""
    for r in $(seq "$ROUNDS"); do
        o1="$o1 $(tps "${OLD_ENV:-X=}" "$old" 1)"
        n1="$n1 $(tps "${NEW_ENV:-X=}" "$new" 1)"
        o2="$o2 $(tps "${OLD_ENV:-X=}" "$old" 2)"
        n2="$n2 $(tps "${NEW_ENV:-X=}" "$new" 2)"
    done
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    for t in 1 2; do
        eval "o=\$o$t n=\$n$t"
        mo=$(echo "$o" | median) mn=$(echo "$n" | median)
        echo "| $nb | $t |$o |$n | $(awk -v a="$mn" -v b="$mo" 'BEGIN {printf "%.2f", a / b}') | $load |"
    done
    summary="$summary
neighbour $nb, 2 threads / 1 thread by round: old $(ratios "$o1" "$o2"); new $(ratios "$n1" "$n2")"
    [ -z "$pid" ] || kill "$pid"
done
echo "$summary"
