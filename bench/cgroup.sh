#!/usr/bin/env bash
# cgroup.sh - jlm run under a memory cgroup limit of 90%, 50% and 25% of the
# container (issue 14: I/O under a budget): with --budget just under the limit
# and with no --budget (the automatic budget from the cgroup: must not be
# OOM-killed). Prints bytes read per token against file - budget and against
# the pager's optimum, and decode tok/s as a ratio of an unlimited run made in
# the same invocation, and bytes read per token as a ratio of the same
# limit's --whole-blocks run (a block's page held whole while it computes:
# the baseline for tensor-granular release, docs/pager.md), made in the same
# invocation.
#
# With LLAMA_BIN (llama.cpp's build/bin holding llama-completion) a second
# table runs jlm (--budget = limit - margin) and llama.cpp (`llama-completion
# -nr`, mmap, its default) on the same model in the same limits, interleaved:
# bytes each read from the disk per token (the same counter for both: the
# child's rusage ru_inblock, which counts O_DIRECT reads and page-fault
# readahead alike) and decode tok/s; jlm's tok/s over its unlimited runs'
# (one in each round of the limit, beside the limited runs: on a shared VM
# one unlimited run moved 16% between invocations); and for a MoE model (one with expert
# pages, which a short run under a budget does not read whole) the bound
# min(resident decode, O_DIRECT bandwidth / bytes a token) that issue 42
# measures the 25% limit against (at 90% and 50% the budget holds the
# run's working set and its reads are the background read's): resident
# decode = the limit's unlimited runs', the bandwidth bench_qd's (1 MiB, one in
# flight) measured in each of that limit's rounds, bytes a token = all the
# run read over the tokens; and at 25% the run's expert pages read a routed
# token over Belady's offline optimum at the expert pages its frames held
# (build/bench/routing_replay on the round's --trace-routing).
#
# Usage: bench/cgroup.sh [MODEL.jlm] [TOKENS=6] [THREADS=2]
#   no MODEL: writes build/bench/mkgguf llama-1b Q4_0 and converts it (temp dir).
#   GGUF: the GGUF MODEL was converted from (for llama.cpp; without MODEL, the
#   generated one).
#   JLM_BIN: folder holding jlm (default build/). MARGIN_MIB: limit - --budget (40).
#   JLM_BUFFERED=1: run with --no-direct (then the page cache is dropped before
#   every run; O_DIRECT reads, the default, need no drop).
#   JLM_FLAGS: more `jlm run` flags for every jlm run, split at spaces (e.g.
#   "--warm-from OTHER.trace": the background read in an earlier run's order;
#   jlm refuses it beside --no-prefetch, so those rows then say exit 2).
# Needs root and a memory cgroup: v1 (mkdir under /sys/fs/cgroup/memory,
# memory.limit_in_bytes) or v2 (a child of this shell's cgroup or of the root
# with memory.max); otherwise prints one line and exits 0.
#
# Bytes per token: the run's source bytes less the first pass (which reads every
# block once: the unlimited run's bytes), over the passes after it (prefill is
# one pass, each decoded token but the last one more). Frames = the budget the
# pager got (--budget less KV, scratch and dense). Optimum: a cyclic scan in
# which the block computed and the block read ahead must be whole reads at least
# (blocks - frames) * N / (N - 2) a pass, N / (N - 1) with --no-prefetch
# (docs/pager.md, Partial frames): the least whole blocks can read; op by op
# (the default) can read less. Each limit runs --budget --whole-blocks (the
# baseline), --budget, --budget with --no-prefetch, and no --budget.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jlm=${JLM_BIN:-$here/../build}/jlm
tokens=${2:-6} threads=${3:-2} margin=$((${MARGIN_MIB:-40} * 1048576))
skip() { echo "cgroup.sh: skipped: $*"; exit 0; }

[ "$(id -u)" = 0 ] || skip "not root (a memory cgroup needs root)"
[ -x "$jlm" ] || { echo "cgroup.sh: $jlm: not built (make all)" >&2; exit 1; }
command -v jq > /dev/null || skip "jq not installed"
command -v python3 > /dev/null || skip "python3 not installed (it reads the runs' rusage)"

# ---------------------------------------------------------------- the cgroup
cg= cgv= lim_file= peak_file=
if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/jlm-bench.$$ cgv=1 lim_file=memory.limit_in_bytes peak_file=memory.max_usage_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    cg=/sys/fs/cgroup/jlm-bench.$$ cgv=2 lim_file=memory.max peak_file=memory.peak
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null ||
        echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null || skip "cannot enable the v2 memory controller"
else
    skip "no memory cgroup (v1 /sys/fs/cgroup/memory or v2 with the memory controller)"
fi
mkdir "$cg" 2> /dev/null || skip "cannot make $cg"
dir=$(mktemp -d /tmp/jlm-cgroup.XXXXXX)
cleanup() { rmdir "$cg" 2> /dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
[ -w "$cg/$lim_file" ] || skip "$cg/$lim_file not writable"

# ---------------------------------------------------------------- the model
model=${1:-}
if [ -z "$model" ]; then
    mk=$here/../build/bench/mkgguf
    [ -x "$mk" ] || { echo "cgroup.sh: $mk: not built (make build/bench/mkgguf)" >&2; exit 1; }
    "$mk" llama-1b Q4_0 "$dir/m.gguf" > /dev/null
    "$jlm" convert "$dir/m.gguf" -o "$dir/m.jlm" > /dev/null 2>&1
    model=$dir/m.jlm GGUF=$dir/m.gguf
fi
[ -r "$model" ] || { echo "cgroup.sh: $model: cannot read" >&2; exit 1; }
file=$(stat -c %s "$model")
flags=(--ids 1,2,3 -n "$tokens" -c 256 -t "$threads" --temp 0 --json --stats)
[ "${JLM_BUFFERED:-0}" = 1 ] && flags+=(--no-direct)
if [ -n "${JLM_FLAGS:-}" ]; then read -ra xflags <<< "$JLM_FLAGS"; flags+=("${xflags[@]}"); fi
passes=$tokens   # prefill + (tokens - 1) decode steps

dropall() { sync; echo 3 > /proc/sys/vm/drop_caches; }
drop() { [ "${JLM_BUFFERED:-0}" = 1 ] && dropall || true; }

# incg CGROUP|- CMD...: runs CMD (in CGROUP), returns its exit status, and
# writes the bytes it read from block devices (rusage ru_inblock * 512, all its
# threads: O_DIRECT reads and page-fault readahead alike) to dir/inblock
incg() {
    python3 -c '
import os, sys
cg, out = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    try:
        if cg != "-":
            with open(cg + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        os.execvp(sys.argv[3], sys.argv[3:])
    except OSError as e:
        print("cgroup.sh: %s: %s" % (sys.argv[3], e), file=sys.stderr)
    os._exit(127)
_, st, ru = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write("%d\n" % (ru.ru_inblock * 512))
sys.exit(os.waitstatus_to_exitcode(st) & 255)
' "$1" "$dir/inblock" "${@:2}"
}
oomkills() {
    if [ $cgv = 1 ]; then awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$cg/memory.oom_control" 2> /dev/null || echo 0
    else awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$cg/memory.events" 2> /dev/null || echo 0; fi
}

# within LIMIT|- OUT CMD...: CMD (in the cgroup at LIMIT bytes, or outside
# it) with stdout to OUT, stderr to dir/err -> dir/rc, dir/peak, dir/oom, dir/inblock
within() {
    local limit=$1 out=$2 oom0=0
    shift 2
    if [ "$limit" != - ]; then
        if [ $cgv = 1 ]; then
            echo 0 > "$cg/memory.max_usage_in_bytes" 2> /dev/null || true
            echo "$limit" > "$cg/$lim_file"
        else
            echo "$limit" > "$cg/$lim_file"
            echo max > "$cg/memory.swap.max" 2> /dev/null || true
        fi
        oom0=$(oomkills)
    fi
    set +e
    incg "$([ "$limit" = - ] && echo - || echo "$cg")" "$@" > "$out" 2> "$dir/err"
    echo $? > "$dir/rc"
    set -e
    if [ "$limit" = - ]; then
        echo 0 > "$dir/peak"; echo 0 > "$dir/oom"
    else
        cat "$cg/$peak_file" 2> /dev/null > "$dir/peak" || echo 0 > "$dir/peak"
        echo $(($(oomkills) - oom0)) > "$dir/oom"
    fi
}

# run LIMIT|- BUDGET|- -> dir/out.json and within's files
run() {
    local limit=$1 budget=$2 extra=()
    [ "$budget" != - ] && extra=(--budget "$budget")
    drop
    within "$limit" "$dir/out.json" "$jlm" run "$model" "${flags[@]}" "${extra[@]}"
}
j() { jq -r "$1" "$dir/out.json"; }

run - 0
[ "$(cat "$dir/rc")" = 0 ] || { echo "cgroup.sh: unlimited run failed: $(cat "$dir/err")" >&2; exit 1; }
blocks=$(j .pager.arrays[0].bytes_read) nb=$(j .pager.arrays[0].resident_pages) tps0=$(j .timings.decode_tps)
moe=$(j '(.pager.arrays | length) > 2 and .pager.arrays[2].page_ins > 0')   # expert pages read: a MoE model
echo "model $model: $file bytes, $nb blocks of $((blocks / nb)) bytes; cgroup v$cgv; $tokens tokens (1 prefill pass +" \
    "$((tokens - 1)) decode passes), -t $threads, -c 256; reads $([ "${JLM_BUFFERED:-0}" = 1 ] && echo "buffered, page cache dropped before each run" || echo "O_DIRECT (no page cache to drop)")"
printf 'unlimited: decode %.3f tok/s (the baseline)\n\n' "$tps0"
printf '| limit | --budget | frames | read/token | file - budget | ratio | vs whole blocks | blocks - frames | whole-block optimum | ratio | tok/s | vs unlimited | peak | oom |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
for pct in 90 50 25; do
    limit=$((file * pct / 100))
    whole_per=0
    for mode in whole budget nopf auto; do
        saved=("${flags[@]}")
        case $mode in
        whole) b=$((limit - margin)); flags+=(--whole-blocks); run "$limit" "$b"; blabel="$(mb "$b") --whole-blocks" ;;
        budget) b=$((limit - margin)); run "$limit" "$b"; blabel=$(mb "$b") ;;
        nopf) b=$((limit - margin)); flags+=(--no-prefetch); run "$limit" "$b"; blabel="$(mb "$b") --no-prefetch" ;;
        auto) b=; run "$limit" -; blabel=auto ;;
        esac
        flags=("${saved[@]}")
        k=2; [ $mode = nopf ] && k=1
        rc=$(cat "$dir/rc") peak=$(cat "$dir/peak") oom=$(cat "$dir/oom")
        if [ "$rc" != 0 ]; then
            printf '| %d%% (%s) | %s | - | - | - | - | - | - | - | - | - | exit %s | %s | %s |\n' $pct "$(mb $limit)" "$blabel" "$rc" \
                "$(mb "$peak")" "$oom"
            continue
        fi
        read_b=$(j .pager.arrays[0].bytes_read) frames=$(j .pager.budget) tps=$(j .timings.decode_tps)
        [ -z "$b" ] && b=$(sed -n 's/^memory: budget \([0-9]*\) .*/\1/p' "$dir/err")   # auto: the budget it took
        [ -n "$b" ] || b=$frames
        per=$(awk -v r="$read_b" -v bl="$blocks" -v p=$passes 'BEGIN { printf "%.0f", (r - bl) / (p - 1) }')
        [ $mode = whole ] && whole_per=$per
        wp=$whole_per; [ $mode = auto ] && wp=0   # (another budget: no ratio)
        awk -v per="$per" -v wper="$wp" -v bl="$blocks" -v file="$file" -v b="$b" -v fr="$frames" -v n="$nb" \
            -v tps="$tps" -v tps0="$tps0" -v k=$k -v S=$((blocks / nb)) -v pct=$pct -v lim=$limit -v bl_="$blabel" -v peak="$peak" -v oom="$oom" '
            function mb(x) { return sprintf("%.1f MB", x / 1e6) }
            BEGIN {
                fb = file - b; bf = bl - fr; if (bf < 0) bf = 0
                if (fr < 2 * S) k = 1   # no room to read ahead: prefetch skipped
                opt = bf * n / (n - k)
                printf "| %d%% (%s) | %s | %s | %s | %s | %.3f | %s | %s | %s | %.3f | %.3f | %.3f | %s | %s |\n",
                    pct, mb(lim), bl_, mb(fr), mb(per), mb(fb), (fb > 0 ? per / fb : 0),
                    (wper > 0 ? sprintf("%.3f", per / wper) : "-"), mb(bf), mb(opt),
                    (opt > 0 ? per / opt : 0), tps, tps / tps0, mb(peak), oom
            }'
    done
done
echo
if [ "$moe" = true ]; then
    echo "(a MoE model: this table's reads are its text blocks' only; the side-by-side table below counts all it read)"
fi
echo "read/token: (bytes read - the first pass) / $((passes - 1)); file - budget: the --budget given, or the automatic" \
     "one (--stats); vs whole blocks: read/token over the same limit's --whole-blocks run's; frames: what the pager got of it; whole-block optimum: (blocks - frames) * N / (N - k), the least a cyclic scan can read when k blocks must be whole (k = 2 with prefetch: the one computed and the one read ahead; 1 without, or with frames below two blocks); op by op (the default) may read less"

# ---------------------------------------------------------------- side by side with llama.cpp
lc=${LLAMA_BIN:-}/llama-completion
if [ -z "${LLAMA_BIN:-}" ]; then
    echo "llama.cpp: LLAMA_BIN is unset (llama.cpp's build/bin with llama-completion): side by side skipped"
elif [ ! -x "$lc" ]; then
    echo "llama.cpp: $lc: not found: side by side skipped"
elif [ -z "${GGUF:-}" ] || [ ! -r "$GGUF" ]; then
    echo "llama.cpp: no GGUF (GGUF=the file MODEL was converted from): side by side skipped"
else
    rounds=${ROUNDS:-3}
    # llama.cpp's defaults otherwise (mmap); -nr: no repacking into anonymous
    # memory (which would copy the weights out of the page cache); no warm-up
    # pass (jlm run makes none)
    lflags=(-m "$GGUF" -p "hello world" -n "$tokens" -c 256 -t "$threads" --temp 0 -no-cnv --ignore-eos --no-warmup -nr)
    # the decode line of llama.cpp's timings: runs and tokens per second
    lc_eval() { grep -E ' eval time = .* runs ' "$dir/err" | grep -v prompt | tail -1 |
                sed -E 's/.*\/ *([0-9]+) runs .*, *([0-9.]+) tokens per second.*/\1 \2/'; }
    runlc() { dropall; within "$1" "$dir/lc.out" "$lc" "${lflags[@]}"; }
    runj() { dropall; within "$1" "$dir/out.json" "$jlm" run "$model" "${flags[@]}" ${2:+--budget "$2"} "${@:3}"; }   # run's, always dropping
    med() { tr ' ' '\n' | awk NF | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print 0 }'; }
    # first passes (every weight read once: subtracted from the limited runs) and the unlimited tok/s
    runj -; [ "$(cat "$dir/rc")" = 0 ] || { echo "cgroup.sh: jlm unlimited run failed: $(cat "$dir/err")" >&2; exit 1; }
    j_first=$(cat "$dir/inblock") j_tps0=$(j '.timings.decode_tps * 1000 | round / 1000')
    qd=$here/../build/bench/bench_qd rr=$here/../build/bench/routing_replay
    # issue 42's bytes against the optimum (a MoE model at 25%): the run's
    # expert pages read over the tokens it routed, over Belady's optimum at
    # the expert pages its frames held at the end, replayed from its own
    # --trace-routing (routing_replay: bytes at the trace's mean expert page)
    optratio() {
        [ -x "$rr" ] || return 0
        local slots xb opt
        slots=$(j '.pager.arrays[2].resident_pages') xb=$(j '.pager.arrays[2].bytes_read')
        opt=$("$rr" "$dir/route.trace" --slots "$slots" 2> /dev/null | awk -F'|' -v s="$slots" '$2 + 0 == s && NF > 8 { print $(NF - 5) + 0 }') || true
        awk -v xb="$xb" -v opt="$opt" -v n="$(awk '!/^#/ { p[$1] = 1 } END { print length(p) }' "$dir/route.trace")" \
            'BEGIN { if (opt > 0 && n > 0) printf "%.4f:%.3f:%.3f", xb / n / 1e6 / opt, xb / n / 1e6, opt }'
    }
    diskbw() {   # GB/s, one O_DIRECT read of 1 MiB in flight; nothing if bench_qd is not built or refuses
        { [ -x "$qd" ] && "$qd" "$model" 1 256 2> /dev/null | awk -F'|' '/^\| 1 MiB/ { gsub(/[^0-9.]/, "", $3); print $3 }'; } || true
    }
    runlc -; [ "$(cat "$dir/rc")" = 0 ] || { echo "cgroup.sh: llama.cpp unlimited run failed: $(tail -3 "$dir/err")" >&2; exit 1; }
    l_first=$(cat "$dir/inblock"); read -r l_runs l_tps0 <<< "$(lc_eval)"
    echo
    echo "side by side: jlm run (--budget = limit - $((margin / 1048576)) MiB) and llama.cpp ($lc ${lflags[*]:2}) on" \
         "$(basename "$GGUF"), page cache dropped before every run; unlimited: jlm $j_tps0 tok/s (first pass $(mb "$j_first")), llama.cpp" \
         "$l_tps0 tok/s ($l_runs decode runs; first pass $(mb "$l_first")); median of $rounds interleaved rounds"
    echo
    printf '| limit | jlm read/token | llama.cpp read/token | llama.cpp / jlm | jlm tok/s | llama.cpp tok/s | jlm / llama.cpp | jlm unlimited tok/s | jlm / its unlimited | bound tok/s | jlm / bound | peak jlm / llama.cpp | oom jlm / llama.cpp | exits |\n'
    printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
    bws= opts=
    for pct in 90 50 25; do
        limit=$((file * pct / 100))
        jr= jt= lr= lt= jp=0 lp=0 jo=0 lo=0 ex= bw= ut=
        for ((r = 0; r < rounds; r++)); do
            [ "$moe" = true ] && [ $pct = 25 ] && bw+=" $(diskbw)"
            runj -   # the unlimited run of this round: the baseline beside it
            [ "$(cat "$dir/rc")" = 0 ] && ut+=" $(j .timings.decode_tps)" || ex+=" jlm-unlimited:$(cat "$dir/rc")"
            rtrace=(); [ "$moe" = true ] && [ $pct = 25 ] && rtrace=(--trace-routing "$dir/route.trace")
            runj "$limit" $((limit - margin)) "${rtrace[@]}"
            [ "$(cat "$dir/rc")" = 0 ] && { jr+=" $(cat "$dir/inblock")"; jt+=" $(j .timings.decode_tps)"; } || ex+=" jlm:$(cat "$dir/rc")"
            [ ${#rtrace[@]} -gt 0 ] && [ "$(cat "$dir/rc")" = 0 ] && opts+=" $(optratio)"
            jp=$(( $(cat "$dir/peak") > jp ? $(cat "$dir/peak") : jp )); jo=$((jo + $(cat "$dir/oom")))
            runlc "$limit"
            if [ "$(cat "$dir/rc")" = 0 ]; then
                read -r runs tps <<< "$(lc_eval)"
                lr+=" $(( ($(cat "$dir/inblock") - l_first) / (runs > 0 ? runs : 1) ))"; lt+=" $tps"
            else
                ex+=" llama.cpp:$(cat "$dir/rc")"
            fi
            lp=$(( $(cat "$dir/peak") > lp ? $(cat "$dir/peak") : lp )); lo=$((lo + $(cat "$dir/oom")))
        done
        jrm=$(echo "$jr" | med) jtm=$(echo "$jt" | med) lrm=$(echo "$lr" | med) ltm=$(echo "$lt" | med) bwm=$(echo "$bw" | med)
        utm=$(echo "$ut" | med)
        bws+="$bw"
        awk -v pct=$pct -v lim=$limit -v jr="$jrm" -v jf="$j_first" -v p=$passes -v lr="$lrm" -v jt="$jtm" -v lt="$ltm" \
            -v jp=$jp -v lp=$lp -v jo=$jo -v lo=$lo -v ex="${ex:- all 0}" -v moe="$moe" -v t0="$utm" -v bw="$bwm" -v n=$tokens '
            function mb(x) { return sprintf("%.1f MB", x / 1e6) }
            BEGIN {
                # a MoE run under a budget reads less than the whole file: all it read over the tokens
                jpt = moe == "true" ? jr / n : jr > 0 ? (jr - jf) / (p - 1) : 0
                mo = moe == "true" && pct == 25   # the bound: the smallest limit (the others hold the working set)
                bound = mo && bw > 0 && jpt > 0 ? bw * 1e9 / jpt : 0
                if (bound > t0 || (mo && bound == 0)) bound = t0
                printf "| %d%% (%s) | %s | %s | %s | %.3f | %.3f | %s | %.3f | %.3f | %s | %s | %s / %s | %d / %d |%s |\n", pct, mb(lim),
                    mb(jpt), mb(lr), (jpt > 0 ? sprintf("%.2fx", lr / jpt) : "-"), jt, lt,
                    (lt > 0 ? sprintf("%.2fx", jt / lt) : "-"), t0, (t0 > 0 ? jt / t0 : 0),
                    (mo ? sprintf("%.1f", bound) : "-"), (mo && bound > 0 ? sprintf("%.3f", jt / bound) : "-"),
                    mb(jp), mb(lp), jo, lo, ex
            }'
    done
    echo
    echo "jlm unlimited tok/s: the median of a jlm run without a limit or --budget made in each of that limit's rounds" \
         "(the baseline of jlm / its unlimited, and the bound's resident decode)"
    if [ "$moe" = true ]; then
        echo "read/token: bytes the process read from the disk (rusage, both tools the same counter); jlm's (a MoE model:" \
             "it reads what its routing and background read ask for, not the whole file) all over the $tokens tokens," \
             "llama.cpp's less its unlimited run's (its load) over its decode runs; bound: min(jlm unlimited tok/s," \
             "O_DIRECT bandwidth / jlm read/token) at 25%, the bandwidth bench_qd's median of that limit's" \
             "rounds ($(echo $bws) GB/s)"
        if [ -n "$(echo $opts)" ]; then
            echo "bytes against the optimum at 25%: jlm's expert pages read a routed token over Belady's optimum at the" \
                 "expert pages its frames held (routing_replay on each round's --trace-routing): median" \
                 "$(echo "$opts" | tr ' ' '\n' | awk -F: 'NF == 3 { print $1 }' | med)x (ratio:jlm MB:optimum MB, each round:" \
                 "$(echo $opts))"
        elif [ ! -x "$rr" ]; then
            echo "bytes against the optimum: $rr not built (make build/bench/routing_replay): skipped"
        fi
    else
        echo "read/token: bytes the process read from the disk (rusage, both tools the same counter) less its unlimited" \
             "run's (the first pass), over the passes after the first (jlm: $((passes - 1)); llama.cpp: its decode runs)"
    fi
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
