#!/usr/bin/env bash
# check-engine.sh - the engine's structure (issue 38), checked by .ci/run:
#  1. no source file under engine/ is over 1,000 lines (the forward pass is
#     split into the loop, the executor, the streamer and one file per
#     architecture family; no file grows back into the one graph);
#  2. the layer loops and the ops make no paging call: model.c, exec*.c,
#     vision.c and engine/arch/ acquire and release pages only through the
#     streamer (engine/stream.c), never jlm_pager_get/unpin/prefetch or a
#     device frame's get/put/prefetch (nor advance a page: jlm_pager_advance).
# Usage: scripts/check-engine.sh   (from anywhere; prints each violation)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX=1000
bad=0
while IFS= read -r f; do
    n=$(wc -l < "$f")
    if [ "$n" -gt "$MAX" ]; then
        echo "$f: $n lines (at most $MAX in engine/)"
        bad=1
    fi
done < <(find engine -name '*.[ch]' | sort)
for f in engine/model.c engine/exec*.c engine/vision.c engine/arch/*.c; do
    if grep -nE '\bjlm_(pager_(get|advance|unpin|prefetch(_range)?)|dev_(page_get|page_put|prefetch(_end)?))\(' "$f"; then
        echo "$f: a paging call outside the streamer (engine/stream.c)"
        bad=1
    fi
done
[ $bad -eq 0 ] && echo "check-engine: every engine/ file is at most $MAX lines; paging only in the streamer"
exit $bad
