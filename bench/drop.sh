#!/usr/bin/env bash
# bench/drop.sh - drop-to-first-token through a jlmfs mount against convert
# then run, and conversion against cp, in one run (issue 14), interleaved
# rounds, medians, printed as ratios.
#
#   bench/drop.sh [ROUNDS]           (default 3; run from the repository root
#                                     after `make all bench`)
#   MODEL=x.gguf bench/drop.sh       another GGUF (default: mkgguf synth-1b Q4_0)
#
# Each round, the source GGUF warm in the page cache (read once first):
#   cp       cp to a plain folder, then sync (the copy's own cost, durable)
#   convert  jlm convert to a plain folder (it fsyncs), then jlm run -n 1
#   drop     cp into the mount, then jlm run -n 1 through the view: the time
#            from the start of cp to the first token (the view converts on
#            demand and in the background at once)
# jlm run reads three prompt ids and generates one token (--ids 1,2,3 -n 1),
# so every block is read once. Needs FUSE (fusermount3) and a free folder in
# /tmp. drop_caches is used where permitted (root), to start each round from
# the same cache state.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}
J=build/jlm JFS=build/jlmfs MK=build/bench/mkgguf
for x in $J $JFS; do [ -x "$x" ] || { echo "drop.sh: $x missing (make all)" >&2; exit 1; }; done
w=$(mktemp -d /tmp/jlmdrop.XXXXXX)
cleanup() { fusermount3 -u "$w/mnt" 2>/dev/null || true; rm -rf "$w"; }
trap cleanup EXIT
mkdir -p "$w/src" "$w/mnt" "$w/plain"
if [ -n "${MODEL:-}" ]; then
    cp "$MODEL" "$w/m.gguf"
else
    [ -x "$MK" ] || { echo "drop.sh: $MK missing (make bench)" >&2; exit 1; }
    "$MK" synth-1b Q4_0 "$w/m.gguf" >/dev/null
fi
size=$(stat -c %s "$w/m.gguf")
now() { date +%s.%N; }
el() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
settle() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; cat "$w/m.gguf" > /dev/null; }
CP="" CONV="" RUN="" CR="" DCP="" DROP=""
for r in $(seq "$R"); do
    settle
    a=$(now); cp "$w/m.gguf" "$w/plain/c.gguf"; sync; b=$(now)
    CP="$CP $(el "$a" "$b")"; rm -f "$w/plain/c.gguf"
    settle
    a=$(now); $J convert "$w/m.gguf" -o "$w/plain/m.jlm" >/dev/null 2>&1; b=$(now)
    $J run "$w/plain/m.jlm" --ids 1,2,3 -n 1 --temp 0 >/dev/null 2>&1; c=$(now)
    CONV="$CONV $(el "$a" "$b")"; RUN="$RUN $(el "$b" "$c")"; CR="$CR $(el "$a" "$c")"
    rm -f "$w/plain/m.jlm"
    rm -rf "$w/src/m.gguf" "$w/src/.jlmfs-cache"
    settle
    $JFS "$w/src" "$w/mnt"
    a=$(now); cp "$w/m.gguf" "$w/mnt/m.gguf"; b=$(now)
    $J run "$w/mnt/m.jlm" --ids 1,2,3 -n 1 --temp 0 >/dev/null 2>"$w/run.err" ||
        { echo "drop.sh: jlm run through the mount failed:" >&2; cat "$w/run.err" >&2; exit 1; }
    c=$(now)
    DCP="$DCP $(el "$a" "$b")"; DROP="$DROP $(el "$a" "$c")"
    fusermount3 -u "$w/mnt"
    echo "round $r: cp+sync $(echo "$CP" | awk "{print \$NF}") s, convert+run $(echo "$CR" | awk '{print $NF}') s, drop-to-first-token $(echo "$DROP" | awk '{print $NF}') s" >&2
done
m_cp=$(echo "$CP" | median) m_conv=$(echo "$CONV" | median) m_run=$(echo "$RUN" | median)
m_cr=$(echo "$CR" | median) m_dcp=$(echo "$DCP" | median) m_drop=$(echo "$DROP" | median)
printf 'model %s (%.1f MiB), %s rounds, medians\n' "${MODEL:-mkgguf synth-1b Q4_0}" "$(echo "$size / 1048576" | bc -l)" "$R"
printf '| step | seconds |\n|---|---|\n'
printf '| cp to a folder + sync | %s |\n| jlm convert | %s |\n| jlm run -n 1 (plain file) | %s |\n' "$m_cp" "$m_conv" "$m_run"
printf '| convert + run | %s |\n| cp into the mount | %s |\n| drop-to-first-token | %s |\n' "$m_cr" "$m_dcp" "$m_drop"
awk -v cp="$m_cp" -v cv="$m_conv" -v cr="$m_cr" -v d="$m_drop" -v dcp="$m_dcp" 'BEGIN {
    printf "convert / (cp + sync) %.2fx; drop-to-first-token / (convert + run) %.2fx; cp into the mount / cp + sync %.2fx\n",
           cv / cp, d / cr, dcp / cp }'
