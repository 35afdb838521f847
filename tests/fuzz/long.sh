#!/bin/bash
# tests/fuzz/long.sh - longer libFuzzer runs than `make fuzz-smoke`, each
# target with its seed corpus for the seconds given, one at a time (one core),
# under nice. Run after `make fuzz`, from the repository root:
#   tests/fuzz/long.sh fuzz_convert:240 fuzz_jinja:180 fuzz_image:1800:10000000 ...
# (target:seconds[:runs]: with runs, the target stops at that many executions
# or at the seconds, whichever comes first)
# (no arguments: every target for FUZZ_SECONDS, default 60). New inputs go to
# build-fuzz/corpus-long/<target> (kept between runs, so runs resume), logs
# to build-fuzz/<target>.long.log, crashes to build-fuzz/crash-*. Prints one
# table row per target: executions, seconds, exec/s, corpus, coverage, result.
# FUZZ_NICE (default 19) and FUZZ_TIMEOUT (libFuzzer's per-input -timeout,
# default 10 s) change how it runs beside other work: on a loaded machine a
# starved process can pass 10 s on an input that takes 0.1 s alone.
set -u
cd "$(dirname "$0")/../.." || exit 2
[ $# -gt 0 ] || set -- $(for t in build-fuzz/fuzz_*; do echo "$(basename "$t"):${FUZZ_SECONDS:-60}"; done)
mm=build-fuzz/seeds/mmproj
mkdir -p "$mm" && cp -n tests/models/mmproj-tinygemma3.gguf "$mm/" 2>/dev/null
rc_all=0
echo "| target | executions | seconds | exec/s | corpus | cov | result |"
echo "|---|---|---|---|---|---|---|"
for arg in "$@"; do
    n=${arg%%:*} s=${arg#*:} runs=()
    case $s in *:*) runs=(-runs="${s#*:}"); s=${s%%:*} ;; esac
    [ -x "build-fuzz/$n" ] || { echo "| $n | | | | | | missing (make fuzz) |"; rc_all=1; continue; }
    seeds=() extra=()
    case $n in
    fuzz_convert|fuzz_gguf) seeds=(build-fuzz/seeds/convert) ;;
    fuzz_engine|fuzz_jlm|fuzz_picture) seeds=(build-fuzz/seeds/engine) ;;
    fuzz_tokenizer) seeds=(build-fuzz/seeds/tokenizer) ;;
    fuzz_jinja) seeds=(build-fuzz/seeds/jinja tests/fuzz/seeds-jinja) ;;
    fuzz_hf_tokenizer) seeds=(tests/fuzz/seeds-hf-tokenizer) ;;
    fuzz_safetensors) seeds=(tests/fuzz/seeds-safetensors) ;;
    fuzz_serve_req) seeds=(tests/fuzz/seeds-serve-req) ;;
    fuzz_image) seeds=(tests/models/images) ;;
    fuzz_mmproj) seeds=("$mm" tests/fuzz/seeds-mmproj); extra=(-max_len=1100000) ;;
    esac
    c=build-fuzz/corpus-long/$n
    mkdir -p "$c"
    log=build-fuzz/$n.long.log
    t0=$(date +%s.%N)
    nice -n "${FUZZ_NICE:-19}" "build-fuzz/$n" -max_total_time="$s" -rss_limit_mb=2048 -timeout="${FUZZ_TIMEOUT:-10}" -print_final_stats=1 \
        -artifact_prefix=build-fuzz/ "${runs[@]}" "${extra[@]}" "$c" "${seeds[@]}" >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    ex=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
    res=clean
    [ $rc -eq 0 ] || { res="rc $rc: $(grep -m1 -E 'ERROR|SUMMARY|Test unit written' "$log" | cut -c1-80)"; rc_all=1; }
    el=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", b - a}')
    echo "| $n | ${ex:-?} | $el | $(( ${ex:-0} / (el > 0 ? el : 1) )) | $(ls "$c" | wc -l) | ${cov:-?} | $res |"
done
exit $rc_all
