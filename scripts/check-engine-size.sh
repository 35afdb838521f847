#!/usr/bin/env bash
# check-engine-size.sh - fails when a source file under engine/ is over 1,000
# lines (issue 38: the forward pass is split into the loop, the executor,
# the streamer and one file per architecture family; no file grows back into
# the one graph). Run by .ci/run.
# Usage: scripts/check-engine-size.sh   (from anywhere; prints each file over)
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
[ $bad -eq 0 ] && echo "check-engine-size: every engine/ file is at most $MAX lines"
exit $bad
