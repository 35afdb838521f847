#!/usr/bin/env bash
# check-exports.sh - fails when a symbol with external linkage does not carry
# the project's prefix (docs/architecture.md, "Naming"): every global symbol
# that build/libjlm.a and the tools' objects (build/obj/cli/*.o) define must
# start with jlm_ or jlmfs_, or be file-local (static). Exempt: main (the
# tools' entry points) and what the compiler makes, never a C identifier: names
# starting with __ (nvcc's registration stubs and fat-binary handles in
# kernels.o) or holding a dot (DW.ref.__gxx_personality_v0). C++ names
# (kernels/cuda/kernels.cu) are read demangled. Run by .ci/run after the build.
# Usage: scripts/check-exports.sh [BUILD]   (BUILD defaults to build; one line
# per violation, naming the object and the symbol)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lib=$build/libjlm.a
[ -f "$lib" ] || { echo "check-exports: $lib not found (run make first)"; exit 2; }
tools=("$build"/obj/cli/*.o)
[ -e "${tools[0]}" ] || { echo "check-exports: no tool objects under $build/obj/cli (run make first)"; exit 2; }

# nm -A -P: "lib.a[obj.o]: name type value size" or "obj.o: name type ..."; -g
# external only, --defined-only what each object itself defines. C++ names are
# demangled (c++filt) before the prefix is read: "jlm_cu_x(args)".
bad=$(nm -A -P -g --defined-only "$lib" "${tools[@]}" 2>/dev/null |
    awk '{ obj = $1; sub(/:$/, "", obj); sub(/^[^[]*\[/, "", obj); sub(/\]$/, "", obj); print obj, $2 }' |
    c++filt |
    awk '{ obj = $1; name = substr($0, length(obj) + 2);
           if (name ~ /^(jlm_|jlmfs_)/ || name == "main" || name ~ /^__/ || name ~ /^[^(]*\./) next;
           print obj ": " name }' | sort -u)
if [ -n "$bad" ]; then
    echo "$bad"
    echo "check-exports: $(wc -l <<<"$bad") external symbol(s) without the jlm_/jlmfs_ prefix (make them static or rename them)"
    exit 1
fi
echo "check-exports: every external symbol starts with jlm_ or jlmfs_"
