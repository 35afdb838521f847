#!/usr/bin/env bash
# twohost.sh - two hosts share one converted cache on GlusterFS
# (docs/scale-out.md). Run as root from the repository root after `make all`;
# .ci/run runs it. Bounded: every wait has a deadline, the whole run ~1-2 min.
#
# The "hosts" are two network namespaces joined by a veth pair (10.99.0.1,
# 10.99.0.2). glusterd and a one-brick volume are started by this script (no
# systemd; glusterd's state under the test's folder), host A serves the brick,
# each host mounts the volume with its own Gluster FUSE client and runs its
# own jlmfs (cache=VOLUME/cache,shared, its own db=, its own source folder).
# Traffic stays in the two namespaces. Everything is removed by the trap.
#
# It shows:
#  1. the same GGUF dropped on both hosts at once is converted exactly once
#     (one log says "converting as host", the other "waiting" then "converted
#     by another host"), both views serve the bytes of `jlm convert`, and both
#     engines give the same tokens;
#  2. kill -9 of the converting daemon mid-conversion: the other host takes
#     over and finishes; no entry is ready before that, and every page of the
#     entry matches its checksum (`jlm verify`, `jlm cache verify`); the
#     killed host, restarted, finds it ready and removes only its own .part;
#  3. readers on both hosts while sources are dropped, rewritten and deleted
#     on either: 0 mismatches, both residency databases pass integrity_check.
#
# Skips (one line, exit 0) only where the kernel has no FUSE or no network
# namespaces. GlusterFS missing is a failure: scripts/deps.sh installs it.
set -u
ROOT=$(pwd)
B=${BUILD:-build}
JLM=$ROOT/$B/jlm
JLMFS=$ROOT/$B/jlmfs
MODEL1=$ROOT/tests/models/stories260K.gguf
MODEL2=$ROOT/tests/models/synth-llama-256.Q4_K_M.gguf
MODEL3=$ROOT/tests/models/synth-qwen2-256.Q4_K_M.gguf
READ_S=${TWOHOST_READ_S:-15}
READERS=${TWOHOST_READERS:-4}   # readers per host in part 3 (the issue's full run: 8 per host for 60 s)
NSA=jlmtwoA$$ NSB=jlmtwoB$$

skip() { echo "twohost: skipped: $*"; exit 0; }
fail() { echo "twohost: FAIL: $*" >&2; for h in A B; do echo "--- log $h" >&2; tail -20 "$T/log$h" >&2 2>/dev/null; done; exit 1; }
say() { echo "twohost: $*"; }

[ -c /dev/fuse ] || skip "no /dev/fuse (the kernel lacks FUSE)"
unshare -n true 2>/dev/null || skip "no network namespaces (unshare -n failed)"
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, glusterd)"
for t in glusterd gluster mount.glusterfs; do
    command -v $t >/dev/null || fail "$t not installed (scripts/deps.sh installs glusterfs-server glusterfs-client)"
done
[ -x "$JLMFS" ] && [ -x "$JLM" ] || fail "build $B/jlm and $B/jlmfs first (make all)"

T=$(mktemp -d /tmp/jlm-twohost.XXXXXX)
GLUSTERD_PID=""
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    for m in "$T/vA" "$T/vB"; do fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
    for m in "$T/gA" "$T/gB"; do umount -l "$m" 2>/dev/null; done
    if [ -n "$GLUSTERD_PID" ]; then
        timeout 20 gluster --mode=script volume stop jlmtwo force >/dev/null 2>&1
        timeout 20 gluster --mode=script volume delete jlmtwo >/dev/null 2>&1
        for f in /var/run/gluster/vols/jlmtwo/*.pid; do   # the brick process, if stop did not end it
            [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
        done
        kill "$GLUSTERD_PID" 2>/dev/null
    fi
    ip netns del "$NSA" 2>/dev/null; ip netns del "$NSB" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

inA() { nsenter --net=/var/run/netns/$NSA "$@"; }
inB() { nsenter --net=/var/run/netns/$NSB "$@"; }
# wait_for SECONDS CMD...: polls CMD every 0.2 s until it succeeds
wait_for() { local end=$((SECONDS + $1)); shift; until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.2; done; }

# ---------------------------------------------------------------- the two hosts and the volume
ip netns add $NSA && ip netns add $NSB || fail "ip netns add"
ip link add jv$$a type veth peer name jv$$b || fail "ip link add veth"
ip link set jv$$a netns $NSA && ip link set jv$$b netns $NSB
ip -n $NSA addr add 10.99.0.1/24 dev jv$$a && ip -n $NSB addr add 10.99.0.2/24 dev jv$$b
for n in $NSA $NSB; do ip -n $n link set lo up; done
ip -n $NSA link set jv$$a up && ip -n $NSB link set jv$$b up || fail "veth up"
pgrep -x glusterd >/dev/null && fail "a glusterd already runs on this machine (its socket /var/run/glusterd.socket is the one the gluster CLI uses)"
mkdir -p "$T/wd" "$T/brick" "$T/gA" "$T/gB" "$T/vA" "$T/vB" "$T/srcA" "$T/srcB" "$T/ref" "$T/dbA" "$T/dbB"
sed "s#/var/lib/glusterd#$T/wd#" /etc/glusterfs/glusterd.vol > "$T/glusterd.vol"
rm -f /var/run/glusterd.socket   # a stale one from a killed glusterd: the CLI would talk to nobody
# daemonized (its -N foreground mode left the CLI unanswered here); the pid from its -p file
timeout 30 nsenter --net=/var/run/netns/$NSA glusterd -f "$T/glusterd.vol" -l "$T/glusterd.log" -p "$T/glusterd.pid" \
    </dev/null >/dev/null 2>&1 || fail "glusterd did not start ($(tail -3 "$T/glusterd.log"))"
GLUSTERD_PID=$(cat "$T/glusterd.pid")
wait_for 20 timeout 5 gluster --mode=script volume list >/dev/null 2>&1 || fail "glusterd did not start ($T/glusterd.log)"
timeout 30 gluster --mode=script volume create jlmtwo 10.99.0.1:"$T/brick" force >"$T/gl.out" 2>&1 ||
    fail "gluster volume create: $(cat "$T/gl.out")"
timeout 60 gluster --mode=script volume start jlmtwo >/dev/null || fail "gluster volume start"
inA timeout 30 mount -t glusterfs 10.99.0.1:/jlmtwo "$T/gA" || fail "host A: mount the volume"
inB timeout 30 mount -t glusterfs 10.99.0.1:/jlmtwo "$T/gB" || fail "host B: mount the volume"
mkdir -m 700 "$T/gA/cache" || fail "mkdir the shared cache"
say "GlusterFS volume up: host A $(stat -c %d "$T/gA/cache"), host B $(stat -c %d "$T/gB/cache") (device numbers of one folder)"

# start_host H SLOW_MS: jlmfs of host H (its own source, mount, database) in its namespace
start_host() {
    local h=$1 slow=$2 g=$T/g$1
    nsenter --net=/var/run/netns/$(eval echo \$NS$h) env JLMFS_TEST_SLOW_MS="$slow" \
        "$JLMFS" "$T/src$h" "$T/v$h" -f -o cache="$g/cache",shared,db="$T/db$h/jlmfs.db" >>"$T/log$h" 2>&1 &
    eval PID$h=$!
    PIDS+=($!)
    wait_for 10 mountpoint -q "$T/v$h" || fail "host $h: jlmfs did not mount"
}
ready() { grep -q '^ready' "$T/v$1/$2.jlm/status" 2>/dev/null; }
# drop H NAME MODEL: a copy appears whole (renamed into place), as a finished download does
drop() { cp "$3" "$T/src$1/.$2.tmp" && mv "$T/src$1/.$2.tmp" "$T/src$1/$2.gguf"; }

start_host A 300   # 300 ms before each unit: both hosts plan m1 while one converts it
start_host B 300
# the refusal of a database on the shared storage, one line
mkdir -p "$T/x"
out=$("$JLMFS" "$T/ref" "$T/x" -f -o cache="$T/gA/cache",shared,db="$T/gA/cache/x.db" 2>&1) &&
    fail "db= inside the shared cache was accepted"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && grep -q "inside the shared cache" <<<"$out" || fail "db= refusal: $out"

# ---------------------------------------------------------------- 1. one conversion for two hosts
"$JLM" convert "$MODEL1" -o "$T/ref/m1.jlm" >/dev/null 2>&1 || fail "jlm convert $MODEL1"
drop A m1 "$MODEL1" & d1=$!
drop B m1 "$MODEL1" & d2=$!
wait $d1 $d2
wait_for 60 ready A m1 & r1=$!     # both hosts look it up at once
wait_for 60 ready B m1 & r2=$!
wait $r1 || fail "host A: m1 not ready"
wait $r2 || fail "host B: m1 not ready"
conv=$(cat "$T/logA" "$T/logB" | grep -c "m1.jlm: converting as host")
waited=$(cat "$T/logA" "$T/logB" | grep -c "m1.jlm: ready (.*converted by another host")
[ "$conv" -eq 1 ] || fail "m1 converted $conv times (expected once)"
[ "$waited" -eq 1 ] || fail "m1: no host says it used the other's conversion ($waited)"
for h in A B; do
    cmp -s "$T/v$h/m1.jlm/model.jlm" "$T/ref/m1.jlm" || fail "host $h: m1.jlm/model.jlm differs from jlm convert"
done
grep -h "m1.jlm: \(converting as\|waiting\|ready\)" "$T/logA" "$T/logB" | sed 's/^/twohost:   /'
tokA=$("$JLM" run "$T/vA/m1.jlm" -p "Once upon a time" -n 8 --temp 0 2>/dev/null)
tokB=$("$JLM" run "$T/vB/m1.jlm" -p "Once upon a time" -n 8 --temp 0 2>/dev/null)
[ -n "$tokA" ] && [ "$tokA" = "$tokB" ] || fail "the engines differ: A '$tokA', B '$tokB'"
say "1. m1 converted once, both views byte-exact, both engines say '$(echo $tokA | head -c 60)'"

# ---------------------------------------------------------------- 2. kill -9 of the converter
kill "$PIDA"; wait "$PIDA" 2>/dev/null
wait_for 10 sh -c "! mountpoint -q '$T/vA'" || fusermount3 -u -z "$T/vA"
start_host A 2000                     # 2 s before each unit: the kill lands mid-conversion
"$JLM" convert "$MODEL2" -o "$T/ref/m2.jlm" >/dev/null 2>&1 || fail "jlm convert $MODEL2"
drop A m2 "$MODEL2"
wait_for 30 ready A m2 & r1=$!        # lookups plan it (once the source is 2 s old)
wait_for 30 grep -q "m2.jlm: converting as host" "$T/logA" || fail "host A did not start converting m2"
drop B m2 "$MODEL2"
wait_for 30 ready B m2 & r2=$!
wait_for 30 grep -q "m2.jlm: waiting: host" "$T/logB" || fail "host B did not wait for host A on m2"
E2=$(grep -o "m2.jlm: planned .*entry c[0-9a-f]*\.v[0-9]*\.jlm" "$T/logB" | grep -o "c[0-9a-f]*\.v[0-9]*\.jlm$" | head -1)
[ -n "$E2" ] || fail "no entry name for m2 in host B's log"
{ kill -9 "$PIDA"; wait "$PIDA"; } 2>/dev/null
kill $r1 $r2 2>/dev/null; wait $r1 $r2 2>/dev/null   # the pollers (A's mount is dead now)
[ -e "$T/gB/cache/$E2" ] && fail "m2's entry exists before any host finished it"
wait_for 60 grep -q "m2.jlm: taking over the conversion" "$T/logB" || fail "host B did not take over m2"
wait_for 60 ready B m2 || fail "host B: m2 not ready after the take-over"
"$JLM" verify "$T/gB/cache/$E2" >/dev/null || fail "jlm verify of m2's entry"
cmp -s "$T/vB/m2.jlm/model.jlm" "$T/ref/m2.jlm" || fail "host B: m2 differs from jlm convert"
"$JLM" cache verify "$T/gB/cache" >"$T/cv.out" || fail "jlm cache verify: $(cat "$T/cv.out")"
oldpart=$(ls "$T/gB/cache" | grep -c "^$E2\.[0-9a-f]\{16\}\.part$")
fusermount3 -u -z "$T/vA"
start_host A 0
wait_for 30 ready A m2 || fail "host A restarted: m2 not ready from the cache"
grep -q "m2.jlm: ready (.*from the cache)" "$T/logA" || fail "host A restarted: m2 not served from the cache"
left=$(ls "$T/gB/cache" | grep -c "^$E2\.[0-9a-f]\{16\}\.part$")
[ "$oldpart" -ge 1 ] && [ "$left" -eq 0 ] || fail "the killed host's .part: $oldpart before its restart, $left after"
grep -h "m2.jlm: \(converting as\|waiting\|taking over\|ready\)" "$T/logA" "$T/logB" | sed 's/^/twohost:   /'
say "2. host A killed mid-conversion: host B took over, every page verified, A's .part removed by A's restart"

# ---------------------------------------------------------------- 3. readers while sources churn
size=$(stat -c %s "$T/ref/m1.jlm")
reader() {   # reader H N: random 4 KiB reads of m1 through host H's view, compared with the reference
    local bad=0 end=$((SECONDS + READ_S)) k
    while [ $SECONDS -lt $end ]; do
        k=$((RANDOM % (size / 4096)))
        cmp -s <(dd if="$T/v$1/m1.jlm/model.jlm" bs=4096 skip=$k count=1 2>/dev/null) \
               <(dd if="$T/ref/m1.jlm" bs=4096 skip=$k count=1 2>/dev/null) || bad=$((bad + 1))
    done
    echo $bad >"$T/bad.$1.$2"
}
churn() {    # drops, rewrites and deletes m3 on both hosts
    local end=$((SECONDS + READ_S)) i=0
    while [ $SECONDS -lt $end ]; do
        h=$([ $((i % 2)) -eq 0 ] && echo A || echo B)
        case $((i % 3)) in
            0) drop $h m3 "$MODEL3" ;;
            1) drop $h m3 "$MODEL1" ;;
            2) rm -f "$T/src$h/m3.gguf" ;;
        esac
        ls "$T/v$h" >/dev/null; cat "$T/v$h/m3.jlm/status" >/dev/null 2>&1
        i=$((i + 1)); sleep 0.7
    done
}
rpids=()
for h in A B; do for n in $(seq "$READERS"); do reader $h $n & rpids+=($!); done; done
churn & rpids+=($!)
wait "${rpids[@]}"
mism=$(cat "$T"/bad.* | awk '{s += $1} END {print s + 0}')
[ "$mism" -eq 0 ] || fail "$mism reads differed from jlm convert"
for h in A B; do
    cat "$T/v$h/m1.jlm/stats" >/dev/null 2>&1   # flushes the daemon's reads
    ic=$(sqlite3 "$T/db$h/jlmfs.db" "pragma integrity_check" 2>&1)
    [ "$ic" = ok ] || fail "host $h: database: $ic"
done
"$JLM" cache ls "$T/gA/cache" | sed 's/^/twohost:   /'
say "3. $READERS readers a host for ${READ_S} s while m3 churned on both hosts: 0 mismatches, both databases ok"
say "ok"
