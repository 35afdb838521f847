#!/usr/bin/env bash
# tsan.sh - the threaded paths of the tools under ThreadSanitizer (`make tsan`).
# Criterion cannot start under TSan (its inheritable arena), so this drives the
# tools built with -fsanitize=thread instead: the engine's thread pool and
# pager, `jlm serve` with concurrent requests (continuous batching), and the
# jlmfs daemon converting in the background while readers and an engine read
# its views, then unmounted. Any race report fails the run (TSan exit 66).
# Usage: JLM_BIN=build-tsan/jlm JLMFS_BIN=build-tsan/jlmfs tests/tsan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
JLM=${JLM_BIN:?}
JLMFS=${JLMFS_BIN:?}
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
work=$(mktemp -d /tmp/jlm-tsan.XXXXXX)
srv=""
cleanup() {
    [ -n "$srv" ] && kill "$srv" 2>/dev/null || true
    fusermount3 -u "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "tsan: FAIL: $*" >&2; exit 1; }
pass=0
ok() { echo "tsan: ok: $*"; pass=$((pass + 1)); }

# 1. The engine: pool threads and the pager at a budget that evicts (MoE experts).
$JLM convert tests/models/synth-qwen3moe-256.Q4_K_M.gguf -o "$work/moe.jlm" 2>/dev/null || fail "convert"
$JLM run "$work/moe.jlm" -p "Once upon a time" -n 8 --temp 0 -t 2 --budget 1 >/dev/null 2>"$work/run.err" ||
    { cat "$work/run.err" >&2; fail "jlm run -t 2 at the minimum budget"; }
ok "jlm run -t 2, minimum budget"
# 1b. The pager's prefetch reader thread: a budget of 3 block frames of the model's 4
#     (--budget covers KV + scratch + dense too: 4.0 MiB of the 6.7 MiB here), so the
#     next block is read while one computes, with evictions every token.
$JLM convert tests/models/synth-llama-256.Q8_0.gguf -o "$work/q8.jlm" 2>/dev/null || fail "convert"
$JLM run "$work/q8.jlm" -p "Once upon a time" -n 12 --temp 0 -t 2 --budget 6700K --stats >/dev/null 2>"$work/run.err" ||
    { cat "$work/run.err" >&2; fail "jlm run -t 2 with prefetch under a budget"; }
grep -q "prefetch: issued [1-9]" "$work/run.err" || { cat "$work/run.err" >&2; fail "no block was prefetched"; }
ok "jlm run -t 2, prefetch under a budget"
# 1c. The CUDA backend's copy thread on the emulated device: two device frames
#     of the 4 blocks (2 x 532480 bytes), so each block's page goes to the
#     device on the copy thread while the block before it computes, and the
#     graph's own page-ins share the staging buffers with it.
$JLM convert tests/models/synth-llama-256.Q4_K_M.gguf -o "$work/q4k.jlm" 2>/dev/null || fail "convert"
JLM_CUDA_EMULATE=1 JLM_CUDA_STAGE_KIB=64 $JLM run "$work/q4k.jlm" -p "Once upon a time" -n 12 --temp 0 -t 2 \
    --backend cuda --gpu-budget 1064960 --stats >/dev/null 2>"$work/run.err" ||
    { cat "$work/run.err" >&2; fail "jlm run --backend cuda (emulated) with device prefetch"; }
grep -qE "^cuda: .*page-ins [0-9]+ \([1-9][0-9]* ahead\)" "$work/run.err" || { cat "$work/run.err" >&2; fail "no device prefetch"; }
ok "jlm run --backend cuda (emulated), the copy thread"

# 2. jlm serve: concurrent requests batched in one pass on each of three models
#    that share one --budget (each takes the others' frames), one of them
#    dropped into the --models folder after the start, then a drain.
mkdir -p "$work/models"
$JLM convert tests/models/stories260K.gguf -o "$work/models/stories.jlm" 2>/dev/null || fail "convert"
cp "$work/models/stories.jlm" "$work/models/other.jlm"
$JLM serve --models "$work/models" --budget 600K --rescan 1 --port 0 --parallel 4 -t 2 \
    > "$work/serve.out" 2>"$work/serve.err" &
srv=$!
port=""
for _ in $(seq 300); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out")
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { cat "$work/serve.err" >&2; fail "jlm serve did not start"; }
cp "$work/models/stories.jlm" "$work/models/third.jlm"   # picked up by the request naming it
models=(stories other third)
pids=()
for i in 1 2 3 4 5 6; do
    curl -sf -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"${models[$((i % 3))]}\",\"prompt\":\"Tim had a dog $i\",\"max_tokens\":12,\"temperature\":0,\"stream\":$([ $i -gt 2 ] && echo true || echo false)}" \
        -o "$work/r$i.json" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a concurrent request failed"; done
kill -TERM "$srv"
rc=0; wait "$srv" || rc=$?
srv=""
[ "$rc" -eq 0 ] || { cat "$work/serve.err" >&2; fail "jlm serve exited $rc"; }
ok "jlm serve: 6 concurrent requests on three models under one budget (one added late), drain"

# 3. jlmfs: background conversion of two models while readers read pages and an
#    engine runs through a view; unmounted with conversions possibly in flight.
mkdir -p "$work/src" "$work/mnt"
$JLMFS "$work/src" "$work/mnt" -f 2>"$work/fs.err" &
fs=$!
for _ in $(seq 300); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
mountpoint -q "$work/mnt" || { cat "$work/fs.err" >&2; fail "jlmfs did not mount"; }
cp tests/models/synth-llama-256.Q4_K_M.gguf "$work/mnt/a.gguf"
cp tests/models/stories260K.gguf "$work/mnt/b.gguf"
readers=()
for v in a b; do
    for r in 1 2; do
        ( for _ in $(seq 50); do [ -e "$work/mnt/$v.jlm/blocks/0" ] && break; sleep 0.1; done
          for f in "$work/mnt/$v.jlm"/blocks/*; do cat "$f" >/dev/null; done ) &
        readers+=($!)
    done
done
for _ in $(seq 600); do [ "$(cat "$work/mnt/b.jlm/status" 2>/dev/null)" = ready ] && break; sleep 0.1; done
$JLM run "$work/mnt/b.jlm" -p "Once upon a time" -n 8 --temp 0 -t 2 >/dev/null 2>"$work/run2.err" ||
    { cat "$work/run2.err" >&2; fail "jlm run through the mount"; }
# a Hugging Face folder dropped in, and a GGUF renamed under its readers (the
# invalidation thread, the folder's identity checks, the log from workers)
cp -r tests/models/hf/tiny-llama-sharded "$work/mnt/h" &
cpid=$!
mv "$work/mnt/a.gguf" "$work/mnt/d.gguf"
for p in "${readers[@]}"; do wait "$p" || true; done
wait "$cpid" || fail "cp -r of a Hugging Face folder into the mount"
for _ in $(seq 600); do [ "$(cat "$work/mnt/h.jlm/status" 2>/dev/null)" = ready ] && break; sleep 0.1; done
[ "$(cat "$work/mnt/h.jlm/status" 2>/dev/null)" = ready ] || fail "h.jlm not ready"
cp tests/models/synth-qwen3-256.Q8_0.gguf "$work/mnt/c.gguf"   # converting while we unmount
fusermount3 -u "$work/mnt"
rc=0; wait "$fs" || rc=$?
[ "$rc" -eq 0 ] || { cat "$work/fs.err" >&2; fail "jlmfs exited $rc"; }
ok "jlmfs: concurrent readers, an engine through a view, a folder dropped in, a rename, unmount mid-conversion"

echo "tsan: all $pass checks clean"
