#!/usr/bin/env bash
# check-includes.sh - fails when an #include breaks the folder dependencies of
# docs/architecture.md, or is not root-relative ("folder/file.h"). Run by .ci/run.
# Usage: scripts/check-includes.sh   (from anywhere; prints one line per violation)
set -euo pipefail
cd "$(dirname "$0")/.."

# folder -> folders its files may include (itself always allowed)
declare -A ALLOW=(
    [base]=""
    [format]="base"
    [converter]="base format"
    [kernels]="base format"
    [engine]="base format kernels"
    [text]="base format"
    [prompt]="base format engine text"
    [residency]="base"
    [serve]="base format engine text prompt residency"
    [picture]="base format residency"
    [fs]="base format converter residency picture"
    [cli]="base format converter kernels engine text prompt residency serve fs picture"
    [bench]="base format converter kernels engine text prompt residency serve fs picture tests"
    [tests]="base format converter kernels engine text prompt residency serve fs picture cli bench"
)

bad=0
while IFS= read -r file; do
    from=${file%%/*}
    [ -n "${ALLOW[$from]+x}" ] || { echo "$file: folder '$from' is not in docs/architecture.md"; bad=1; continue; }
    while IFS=: read -r line inc; do
        target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$inc")
        if [[ $target != */* || $target == ../* || $target == ./* ]]; then
            echo "$file:$line: include \"$target\" is not root-relative"; bad=1; continue
        fi
        to=${target%%/*}
        [ "$to" = "$from" ] && continue
        if [[ " ${ALLOW[$from]} " != *" $to "* ]]; then
            echo "$file:$line: $from/ may not include $to/ (\"$target\"; see docs/architecture.md)"; bad=1
        fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" | cut -d: -f1,2- || true)
done < <(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' | grep -E '^(base|format|converter|kernels|engine|text|prompt|residency|serve|picture|fs|cli|bench|tests)/')

[ $bad -eq 0 ] && echo "check-includes: every include follows docs/architecture.md"
exit $bad
