#!/bin/sh
# check-function-length.sh - no function in the given C files (default:
# cli/*.c) longer than MAX lines (default 80), counted from the line that
# opens its body to the line that closes it. A function starts at a line
# that begins with '{' and ends at the next line that begins with '}'
# (the tree's style: docs/style.md). Prints each offender as
# "FILE:LINE: NAME is N lines (max MAX)" and exits 1 if there is one.
# Usage: scripts/check-function-length.sh [-m MAX] [FILE...]   (run by .ci/run)
max=80
if [ "$1" = "-m" ]; then max=$2; shift 2; fi
if [ $# -eq 0 ]; then
    cd "$(dirname "$0")/.." || exit 2
    set -- cli/*.c
fi
awk -v max="$max" '
    FNR == 1 { inside = 0 }
    /^\{/ { inside = 1; start = FNR; name = prev; next }
    inside && /^\}/ {
        n = FNR - start - 1
        if (n > max) { sub(/\(.*/, "", name); k = split(name, w, /[ *]+/); printf "%s:%d: %s is %d lines (max %d)\n", FILENAME, start, w[k], n, max; bad = 1 }
        inside = 0
    }
    { prev = $0 }
    END { exit bad }
' "$@"
