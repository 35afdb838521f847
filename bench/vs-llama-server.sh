#!/bin/sh
# vs-llama-server.sh - `jlm serve` against llama.cpp's `llama-server` on the
# same GGUF: aggregate generation t/s of the same 8 concurrent requests.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/vs-llama-server.sh
#
# Model: mkgguf's synth-1b (Llama-3.2-1B blocks, vocab 512) with $LAYERS (4)
# layers in Q4_0 (ggml's reference quantizer; ~130 MiB), random weights, and
# --text-vocab: no lone non-ASCII byte tokens, since llama-server (b10359)
# answers output that is not valid UTF-8 with a 500 ("does not match the
# expected Content-only format") and a random model emits such bytes. Both
# servers read that one GGUF (`jlm serve` converts it once into
# $VS_DIR/cache). Both listen on loopback at once with 8 slots and the same
# threads: `jlm serve --parallel 8 -t T -c CTX` and
# `llama-server -np 8 -c 8*CTX -t T -tb T` (llama-server's -c is shared by its
# slots, so each slot gets CTX as jlm's does).
# A round sends each server, one after the other, the same 8 requests at once
# (POST /v1/completions, streamed, an ASCII prompt of ~40 tokens that starts
# with the round and request numbers, so no prompt cache serves it; temperature 0,
# max_tokens $TG, ignore_eos: both generate exactly $TG tokens; the count is
# taken from each answer's `usage`, else from its chunks). The order of the
# two servers alternates between rounds, so load from other tenants of a
# shared machine hits both alike. Per server and round: aggregate t/s =
# completion tokens of the 8 / wall time from the first request sent to the
# last answer's end, and TTFT = the median of the 8 times to the first
# token chunk, and the server's CPU time (user + system, all its threads, from
# /proc) per completion token: the figure other tenants' load moves least.
# Printed: the median over $ROUNDS rounds (3) of each, and jlm / llama-server.
# One unmeasured warm-up round per server first.
#
# Files go to $VS_DIR (default /tmp/jlm-vs-llama-server), never into the
# repository, and are reused by later runs. Knobs (environment): ROUNDS (3),
# TG (64), THREADS (2), CTX (512), LAYERS (4), JLM (build/jlm), MKGGUF
# (build/bench/mkgguf), LLAMA_PORT (18480). LLAMA_BIN unset: one line, exit 0.
set -eu

if [ -z "${LLAMA_BIN:-}" ] || [ ! -x "${LLAMA_BIN:-}/llama-server" ]; then
    echo "vs-llama-server: LLAMA_BIN is unset or has no llama-server (llama.cpp's build/bin): skipped"
    exit 0
fi
ROUNDS=${ROUNDS:-3}
TG=${TG:-64}
THREADS=${THREADS:-2}
CTX=${CTX:-512}
LAYERS=${LAYERS:-4}
JLM=${JLM:-build/jlm}
MKGGUF=${MKGGUF:-build/bench/mkgguf}
LPORT=${LLAMA_PORT:-18480}
DIR=${VS_DIR:-/tmp/jlm-vs-llama-server}
LS="$LLAMA_BIN/llama-server"
for x in "$JLM" "$MKGGUF"; do
    [ -x "$x" ] || { echo "vs-llama-server: $x: not an executable (make all build/bench/mkgguf)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "vs-llama-server: python3 is needed to drive the requests" >&2; exit 1; }
mkdir -p "$DIR"
export XDG_CACHE_HOME="$DIR/cache"   # jlm never converts into ~/.cache here

g="$DIR/synth-1b-L$LAYERS.Q4_0.gguf"
if [ ! -s "$g" ]; then
    echo "vs-llama-server: writing $g" >&2
    "$MKGGUF" synth-1b Q4_0 "$g.tmp" --layers "$LAYERS" --text-vocab
    mv "$g.tmp" "$g"
fi
stem=$(basename "$g" .gguf)

jpid=
lpid=
cleanup() {
    [ -n "$jpid" ] && kill "$jpid" 2>/dev/null && wait "$jpid" 2>/dev/null
    [ -n "$lpid" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
    return 0
}
trap cleanup EXIT INT TERM

# ---------------------------------------------------------------- servers
"$JLM" serve "$g" --host 127.0.0.1 --port 0 --parallel 8 -t "$THREADS" -c "$CTX" >"$DIR/jlm.out" 2>"$DIR/jlm.err" &
jpid=$!
"$LS" -m "$g" --host 127.0.0.1 --port "$LPORT" -np 8 -c $((8 * CTX)) -t "$THREADS" -tb "$THREADS" \
    --no-webui >"$DIR/llama.log" 2>&1 &
lpid=$!
jport=
i=0
while [ $i -lt 600 ]; do   # 60 s: the first start converts the GGUF
    jport=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$DIR/jlm.out" | head -n 1)
    [ -n "$jport" ] && break
    kill -0 "$jpid" 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
done
[ -n "$jport" ] || { echo "vs-llama-server: jlm serve did not start: $DIR/jlm.err" >&2; exit 1; }
i=0
until curl -sf -o /dev/null "http://127.0.0.1:$LPORT/health"; do
    i=$((i + 1))
    kill -0 "$lpid" 2>/dev/null && [ $i -lt 600 ] || { echo "vs-llama-server: llama-server did not start: $DIR/llama.log" >&2; exit 1; }
    sleep 0.1
done

# ---------------------------------------------------------------- rounds
python3 - "$jport" "$LPORT" "$stem" "$ROUNDS" "$TG" "$jpid" "$lpid" <<'EOF'
import http.client, json, os, statistics, sys, threading, time

jport, lport, model, rounds, tg = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
pids = {jport: int(sys.argv[6]), lport: int(sys.argv[7])}
N = 8

def cpu_s(pid):   # the server's user + system CPU seconds, all threads
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def prompt(i, r):   # ASCII, different per request and round (no prompt cache helps)
    return "%d.%d: " % (r, i) + " ".join("w%d" % ((31 * i + 7 * j + r) % 97) for j in range(8))

def one(port, i, r, t0, out):
    body = json.dumps({"model": model, "prompt": prompt(i, r),
                       "max_tokens": tg, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out[i] = ("HTTP %d: %s" % (r.status, r.read()[:200]),)
        return
    ttft, chunks, usage = None, 0, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        o = json.loads(line[6:])
        if o.get("choices"):
            if ttft is None:
                ttft = time.monotonic() - t0
            chunks += 1
        if o.get("usage"):
            usage = o["usage"].get("completion_tokens")
    out[i] = (ttft, usage if usage is not None else chunks, time.monotonic())
    c.close()

def round_(port, r):
    out = [None] * N
    c0 = cpu_s(pids[port])
    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(port, i, r, t0, out)) for i in range(N)]
    for t in th: t.start()
    for t in th: t.join()
    for o in out:
        if o is None or len(o) != 3 or o[0] is None:
            sys.exit("vs-llama-server: a request failed on port %d: %s" % (port, o))
    toks = sum(o[1] for o in out)
    wall = max(o[2] for o in out) - t0
    return toks / wall, statistics.median(o[0] for o in out), toks, (cpu_s(pids[port]) - c0) / toks

servers = [("jlm serve", jport), ("llama-server", lport)]
for name, port in servers:
    round_(port, rounds)   # warm-up
res = {name: [] for name, _ in servers}
for r in range(rounds):
    order = servers if r % 2 == 0 else servers[::-1]
    for name, port in order:
        tps, ttft, toks, cpt = round_(port, r)
        res[name].append((tps, ttft, cpt))
        print("round %d  %-12s  %4d tokens  %8.1f t/s  TTFT %7.1f ms  CPU %6.2f ms/token" %
              (r + 1, name, toks, tps, ttft * 1e3, cpt * 1e3), flush=True)
med = {name: [statistics.median(x[k] for x in v) for k in range(3)] for name, v in res.items()}
print("median of %d rounds, 8 concurrent requests x %d tokens:" % (rounds, tg))
for name, _ in servers:
    print("  %-12s  %8.1f t/s  TTFT %7.1f ms  CPU %6.2f ms/token" % (name, med[name][0], med[name][1] * 1e3, med[name][2] * 1e3))
j, l = med["jlm serve"], med["llama-server"]
print("jlm / llama-server: aggregate t/s %.2fx, TTFT %.2fx, CPU a token %.2fx" % (j[0] / l[0], j[1] / l[1], j[2] / l[2]))
EOF
