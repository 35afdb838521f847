#!/usr/bin/env bash
# gpu-check.sh - the CUDA backend's checks on a GPU machine, in one prepared run
# (< 8 minutes on an H200: the device check within 240 s, the engine check 120 s,
# the benches until 470 s after the start): the device check (every kernel launched on device
# memory against the CPU reference: matvec of the 12 stored types and int8
# quantization bit for bit, norms/softmax/RoPE/activations/GQA attention within
# tolerance), the CUDA matvec bandwidth bench (GB/s as a fraction of a device
# copy and next to pinned host-to-device copy, both measured in the same run),
# the engine on CUDA (build/jlm-cuda-engine: every test model against the CPU
# backend whole, split and at one frame each side, with whole blocks on the
# device (engine/exec_cu.c), then with the matmul offload (JLM_CUDA_BLOCKS=0),
# then four models with an F16 cache on both sides (JLM_CUDA_KV=f16) and three
# with a Q8_0 one (JLM_CUDA_KV=q8_0);
# then decode and prefill of mkgguf's synth-1b in Q4_0, Q8_0 and Q4_K with every
# block resident and with --gpu-budget at half the blocks, so every token pages
# them in from host memory, Q4_0 resident with the graphs off (JLM_CUDA_GRAPH=0) and on the offload for comparison), and the host-harness suite `cuda` when the Criterion binary can run
# there. Ends with a summary; exit status 0 only when every part that ran passed.
#
# The GPU machine has no network and may lack SQLite, jansson, FUSE, Criterion:
# build/jlm-cuda-check and build/jlm-cuda-engine need none of them (static CUDA
# runtime and jansson, libc, libstdc++, libm), so build them here and carry them:
#     make cuda-check           # here, where nvcc exists
#     device run: bench/gpu-check.sh   with carry ["build/jlm-cuda-check", "build/jlm-cuda-engine"]
# If it is missing there and nvcc + make exist, it is built (CUDA=1).
# Usage: bench/gpu-check.sh [--bench-n N]   (bench matrix N x N, default 16384)
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH_N=16384
[ "${1:-}" = "--bench-n" ] && BENCH_N=${2:-16384}
start=$(date +%s)
declare -a summary
status=0

check=build/jlm-cuda-check
if [ ! -x "$check" ] && command -v make >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "== building $check"
    make -j"$(nproc)" cuda-check >/tmp/gpu-check-build.log 2>&1 || { tail -20 /tmp/gpu-check-build.log; }
fi

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

if [ -x "$check" ]; then
    echo "== $check --bench-n $BENCH_N (limit 240 s)"
    timeout 240 "$check" --bench-n "$BENCH_N" | tee /tmp/gpu-check.out
    rc=${PIPESTATUS[0]}
    if grep -q "skip:" /tmp/gpu-check.out; then
        summary+=("device check: SKIPPED ($(grep -m1 'skip:' /tmp/gpu-check.out))"); status=1
    elif [ "$rc" -eq 0 ]; then
        summary+=("device check: PASS ($(grep -c '^PASS' /tmp/gpu-check.out) groups)")
    else
        summary+=("device check: FAIL (rc $rc; $(grep -c '^FAIL' /tmp/gpu-check.out) failing lines)"); status=1
    fi
    bw=$(grep -E '^(Q4_K|Q8_0|Q6_K|MXFP4|F16) ' /tmp/gpu-check.out | awk '{printf "%s %s GB/s (%s); ", $1, $4, $5}')
    [ -n "$bw" ] && summary+=("matvec bandwidth: $bw")
    base=$(grep -m1 '^baseline:' /tmp/gpu-check.out)
    [ -n "$base" ] && summary+=("$base")
else
    summary+=("device check: NOT RUN ($check missing and not buildable here)"); status=1
fi

engine=build/jlm-cuda-engine
if [ -x "$engine" ] && ! grep -q "skip:" /tmp/gpu-check.out 2>/dev/null; then
    echo "== $engine check (every test model; limit 120 s)"
    # the text models: a vision projector (mmproj-*) is no model of its own
    mapfile -t models < <(ls tests/models/*.gguf | grep -v '/mmproj-')
    timeout 120 "$engine" check "${models[@]}" | tee /tmp/gpu-engine.out
    rc=${PIPESTATUS[0]}
    np=$(grep -c '^PASS' /tmp/gpu-engine.out); nf=$(grep -c '^FAIL' /tmp/gpu-engine.out)
    if [ "$rc" -eq 0 ]; then summary+=("engine on cuda vs cpu: PASS ($np runs)"); else summary+=("engine on cuda vs cpu: FAIL (rc $rc, $nf failing of $((np + nf)))"); status=1; fi
    rts=$(grep -o 'a decoded token [0-9]* round trips' /tmp/gpu-engine.out | awk '{print $4}' | sort -n | uniq -c | tr '\n' ';')
    [ -n "$rts" ] && summary+=("whole blocks: round trips of a decoded token (count x value): $rts")
    echo "== $engine check, matmul offload (JLM_CUDA_BLOCKS=0; limit 60 s)"
    JLM_CUDA_BLOCKS=0 timeout 60 "$engine" check "${models[@]}" > /tmp/gpu-engine-off.out
    rc=$?
    np=$(grep -c '^PASS' /tmp/gpu-engine-off.out); nf=$(grep -c '^FAIL' /tmp/gpu-engine-off.out)
    grep '^FAIL' /tmp/gpu-engine-off.out
    if [ "$rc" -eq 0 ]; then summary+=("engine on cuda (offload) vs cpu: PASS ($np runs)"); else summary+=("engine on cuda (offload) vs cpu: FAIL (rc $rc, $nf failing of $((np + nf)))"); status=1; fi
    for kv in f16 q8_0; do   # stories260K's head dimension (8) is no Q8_0 block
        echo "== $engine check, $kv cache (JLM_CUDA_KV=$kv, both engines; limit 30 s)"
        mapfile -t kvm < <(ls $([ "$kv" = f16 ] && echo tests/models/stories260K.gguf) \
            tests/models/synth-llama-256.Q4_0.gguf tests/models/synth-llama-256.Q8_0.gguf \
            tests/models/synth-qwen3moe-256.Q4_K_M.gguf 2>/dev/null)
        JLM_CUDA_KV=$kv timeout 30 "$engine" check "${kvm[@]}" > /tmp/gpu-engine-$kv.out
        rc=$?
        np=$(grep -c '^PASS' /tmp/gpu-engine-$kv.out); nf=$(grep -c '^FAIL' /tmp/gpu-engine-$kv.out)
        grep '^FAIL' /tmp/gpu-engine-$kv.out
        if [ "$rc" -eq 0 ]; then summary+=("engine on cuda (--kv $kv) vs cpu (--kv $kv): PASS ($np runs)"); else summary+=("engine on cuda (--kv $kv) vs cpu (--kv $kv): FAIL (rc $rc, $nf failing of $((np + nf)))"); status=1; fi
    done
    for ty in Q4_0 Q8_0 Q4_K; do
        left=$(( 470 - ($(date +%s) - start) ))
        [ "$left" -gt 30 ] || { summary+=("engine bench $ty: not run (time)"); continue; }
        echo "== $engine bench --synth synth-1b $ty (resident, then --gpu-budget half the blocks)"
        timeout "$left" "$engine" bench --synth synth-1b "$ty" --pp 128 --tg 32 --rounds 3 | tee -a /tmp/gpu-engine.out
        half=$(grep "bench synth-1b-$ty.gguf: block pages" /tmp/gpu-engine.out | tail -1 | awk '{print int($5 * 1048576 / 2)}')
        [ -n "$half" ] && [ "$half" -gt 0 ] && timeout "$left" "$engine" bench --synth synth-1b "$ty" --pp 32 --tg 16 --gpu-budget "$half" | tee -a /tmp/gpu-engine.out
    done
    left=$(( 470 - ($(date +%s) - start) ))
    if [ "$left" -gt 30 ]; then   # the graphs off: a decoded token's launches issued one by one (docs/cuda.md)
        echo "== $engine bench --synth synth-1b Q4_0, no graph (JLM_CUDA_GRAPH=0)"
        JLM_CUDA_GRAPH=0 timeout "$left" "$engine" bench --synth synth-1b Q4_0 --pp 128 --tg 32 --rounds 3 \
            | sed 's/^bench /bench (no graph) /' | tee -a /tmp/gpu-engine.out
    fi
    left=$(( 470 - ($(date +%s) - start) ))
    if [ "$left" -gt 30 ]; then
        echo "== $engine bench --synth synth-1b Q4_0, matmul offload (JLM_CUDA_BLOCKS=0)"
        JLM_CUDA_BLOCKS=0 timeout "$left" "$engine" bench --synth synth-1b Q4_0 --pp 128 --tg 32 --rounds 1 \
            | sed 's/^bench /bench (offload) /' | tee -a /tmp/gpu-engine.out
    fi
    while read -r l; do summary+=("$l"); done < <(grep -E '^bench ' /tmp/gpu-engine.out)
elif [ -x "$engine" ]; then
    summary+=("engine on cuda: not run (no device)")
else
    summary+=("engine on cuda: NOT RUN ($engine missing: make cuda-check here and carry it)"); status=1
fi

if [ -x build/jlm-tests ] && build/jlm-tests --list >/dev/null 2>&1; then
    echo "== suite cuda (host harness)"
    out=$(JLM_BIN=$PWD/build/jlm build/jlm-tests --filter 'cuda/*' 2>&1 | tail -1)
    echo "$out"
    summary+=("suite cuda: $out")
    echo "$out" | grep -q "Failing: 0 | Crashing: 0" || status=1
else
    summary+=("suite cuda: not run here (build/jlm-tests absent or its libraries missing; it runs in CI)")
fi

echo
echo "== gpu-check summary ($(( $(date +%s) - start )) s)"
for s in "${summary[@]}"; do echo "  $s"; done
exit $status
