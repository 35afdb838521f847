#!/bin/bash
# tests/soak.sh - the full-size soak of issue 10 (`make soak`; about
# SOAK_SECONDS + 15 s, so it is not part of `make test`, but .ci/run runs it
# after the suite; the suite's fs_soak is the bounded 6 s version).
#
# Mounts build/jlmfs over a fresh SRC, drops one model (A = stories260K) and
# runs READERS concurrent readers for SOAK_SECONDS against its view m.jlm:
#   - page readers: `cat m.jlm/model.jlm` (one descriptor, every page in
#     order); the bytes must equal `jlm convert` output of A or of B
#     (synth-llama-256.Q4_0) as a whole, or the read must fail (EIO/ENOENT);
#   - engine readers: `jlm run m.jlm/model.jlm` greedy through the mount; its
#     output must equal the same run on A's or B's own converted container,
#     or the run must fail with a non-zero exit.
# A torn read (bytes or output of neither model, or of both) is a mismatch.
# Meanwhile SRC/m.gguf is changed at 1/4, 2/4 and 3/4 of the time:
#   1. replaced by rename (B written aside, renamed over m.gguf);
#   2. rewritten in place (truncate + write A into the same inode);
#   3. renamed away to n.gguf and back.
# Pass: 0 mismatches, both models seen by the readers, the daemon alive and
# mounted, serving m.jlm as A byte for byte at the end, no sanitizer or
# invariant report in its log (JLMFS_CHECK=1 makes it abort on one).
#   tests/soak.sh            (from the repository root, after `make all`)
#   SOAK_SECONDS=20 SOAK_READERS=4 tests/soak.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${JLM_BIN_DIR:-$ROOT/build}
SECS=${SOAK_SECONDS:-60}
READERS=${SOAK_READERS:-8}
ENGINES=${SOAK_ENGINES:-2}            # how many of the readers run the engine
A=$ROOT/tests/models/stories260K.gguf
B=$ROOT/tests/models/synth-llama-256.Q4_0.gguf
JLM=$BIN/jlm
JLMFS=$BIN/jlmfs
for f in "$JLM" "$JLMFS" "$A" "$B"; do
    [ -e "$f" ] || { echo "soak: missing $f (run make all first)" >&2; exit 2; }
done

T=$(mktemp -d /tmp/jlm-soak.XXXXXX)
export XDG_CACHE_HOME=$T/xdg
mkdir -p "$T/src" "$T/mnt" "$T/cache" "$T/res" "$T/bad"
DPID=
cleanup() {
    fusermount3 -u -z "$T/mnt" 2>/dev/null
    if [ -n "$DPID" ]; then kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; fi
    [ -n "${SOAK_KEEP:-}" ] && { echo "soak: kept $T"; return; }
    rm -rf "$T"
}
trap cleanup EXIT

PROMPT="Once upon a time"
RUN_ARGS=(-p "$PROMPT" -n 16 --temp 0 -t 1)
"$JLM" convert "$A" -o "$T/refA.jlm" 2>"$T/convA.err" || { echo "soak: jlm convert A failed" >&2; exit 1; }
"$JLM" convert "$B" -o "$T/refB.jlm" 2>"$T/convB.err" || { echo "soak: jlm convert B failed" >&2; exit 1; }
"$JLM" run "$T/refA.jlm" "${RUN_ARGS[@]}" >"$T/outA" 2>/dev/null || { echo "soak: jlm run A failed" >&2; exit 1; }
"$JLM" run "$T/refB.jlm" "${RUN_ARGS[@]}" >"$T/outB" 2>/dev/null || { echo "soak: jlm run B failed" >&2; exit 1; }
cmp -s "$T/outA" "$T/outB" && { echo "soak: A and B give the same output; the check could not tell them apart" >&2; exit 1; }

cp "$A" "$T/src/m.gguf"
JLMFS_CHECK=1 "$JLMFS" "$T/src" "$T/mnt" -f -o "cache=$T/cache" >"$T/jlmfs.log" 2>&1 &
DPID=$!
for _ in $(seq 200); do mountpoint -q "$T/mnt" && break; sleep 0.05; done
mountpoint -q "$T/mnt" || { echo "soak: jlmfs did not mount; log:" >&2; cat "$T/jlmfs.log" >&2; exit 1; }
V=$T/mnt/m.jlm/model.jlm

# One reader: loops until the deadline, writes "okA okB failed mismatch" counts.
reader() {
    local i=$1 kind=$2 deadline=$3 a=0 b=0 f=0 m=0 out=$T/r$1.out
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if [ "$kind" = cat ]; then
            cat "$V" >"$out" 2>/dev/null; rc=$?
            refa=$T/refA.jlm refb=$T/refB.jlm
        else
            "$JLM" run "$V" "${RUN_ARGS[@]}" >"$out" 2>"$T/r$i.err"; rc=$?
            refa=$T/outA refb=$T/outB
        fi
        if [ $rc -ne 0 ]; then f=$((f + 1))
        elif cmp -s "$out" "$refa"; then a=$((a + 1))
        elif cmp -s "$out" "$refb"; then b=$((b + 1))
        else
            m=$((m + 1)); bad=$T/bad/$kind-r$i-$m-at-$(( $(date +%s) - START ))s
            cp "$out" "$bad"; [ "$kind" = run ] && cp "$T/r$i.err" "$bad.err"
        fi
    done
    echo "$a $b $f $m" >"$T/res/$i.$kind"
}

START=$(date +%s)
END=$((START + SECS))
for i in $(seq 1 "$READERS"); do
    if [ "$i" -le "$ENGINES" ]; then reader "$i" run "$END" & else reader "$i" cat "$END" & fi
done

# The source changes, at 1/4, 2/4, 3/4 of the time.
at_s() { while [ "$(date +%s)" -lt $((START + $1)) ]; do sleep 0.2; done; }
at_s $((SECS / 4))
cp "$B" "$T/src/.m.new" && mv "$T/src/.m.new" "$T/src/m.gguf"; echo "soak: $(( $(date +%s) - START )) s: m.gguf replaced by rename (A -> B)"
at_s $((SECS / 2))
cat "$A" >"$T/src/m.gguf"; echo "soak: $(( $(date +%s) - START )) s: m.gguf rewritten in place (B -> A)"
at_s $((3 * SECS / 4))
mv "$T/src/m.gguf" "$T/src/n.gguf"; sleep 1; mv "$T/src/n.gguf" "$T/src/m.gguf"
echo "soak: $(( $(date +%s) - START )) s: m.gguf renamed to n.gguf and back"
wait $(jobs -p | grep -vx "$DPID")

fail=0
tot() { awk -v c="$1" '{s += $c} END {print s + 0}' "$T"/res/*."$2" 2>/dev/null; }
for kind in cat run; do
    ls "$T"/res/*."$kind" >/dev/null 2>&1 || continue
    printf 'soak: %-3s readers: %d reads of A, %d of B, %d failed, %d torn\n' "$kind" \
        "$(tot 1 $kind)" "$(tot 2 $kind)" "$(tot 3 $kind)" "$(tot 4 $kind)"
done
mism=$(( $(tot 4 cat) + $(tot 4 run) ))
seenA=$(( $(tot 1 cat) + $(tot 1 run) ))
seenB=$(( $(tot 2 cat) + $(tot 2 run) ))
if [ "$mism" -ne 0 ]; then
    echo "soak: FAIL: $mism torn reads (copies in $T/bad); a page reader's copy by 64 KiB pages, A/B = that model's page, 0 = zeros, ? = neither; an engine reader's output and stderr:"
    for f in "$T"/bad/*; do
        case ${f##*/} in
        *.err) continue ;;
        run-*) echo "  ${f##*/}: $(stat -c %s "$f") bytes: $(head -c 200 "$f" | od -An -c | tr -s ' \n' ' ')"
               sed 's/^/    stderr: /' "$f.err" | head -5
               continue ;;
        esac
        size=$(stat -c %s "$f") map=
        for ((o = 0; o < size; o += 65536)); do
            n=$((size - o < 65536 ? size - o : 65536))
            if cmp -s -i "$o:$o" -n "$n" "$f" "$T/refA.jlm"; then map+=A
            elif cmp -s -i "$o:$o" -n "$n" "$f" "$T/refB.jlm"; then map+=B
            elif cmp -s -i "$o:0" -n "$n" "$f" /dev/zero; then map+=0
            else map+='?'; fi
        done
        echo "  ${f##*/}: $size bytes: $map"
    done
    fail=1; SOAK_KEEP=1
fi
[ "$seenA" -gt 0 ] && [ "$seenB" -gt 0 ] || { echo "soak: FAIL: the readers did not see both models (A $seenA, B $seenB)"; fail=1; }
if ! kill -0 "$DPID" 2>/dev/null || ! mountpoint -q "$T/mnt"; then
    echo "soak: FAIL: the daemon died or the mount went; log:"; tail -20 "$T/jlmfs.log"; fail=1
else
    ok=0   # still serving: m.gguf is A again, whole
    for _ in $(seq 100); do cmp -s "$V" "$T/refA.jlm" 2>/dev/null && { ok=1; break; }; sleep 0.1; done
    [ $ok -eq 1 ] || { echo "soak: FAIL: after the soak m.jlm is not A's container"; fail=1; }
fi
if grep -qE "AddressSanitizer|UndefinedBehaviorSanitizer|runtime error|invariant|Aborted" "$T/jlmfs.log"; then
    echo "soak: FAIL: the daemon's log reports:"; grep -E "Sanitizer|runtime error|invariant|Aborted" "$T/jlmfs.log" | head -5
    fail=1
fi
[ $fail -eq 0 ] && echo "soak: PASS ($SECS s, $READERS readers, $ENGINES of them the engine; 3 source changes; 0 torn)"
exit $fail
