#!/usr/bin/env bash
# demo.sh - the README's main job on the bundled model: install what is
# missing, build, convert models/stories260K.gguf to a .jlm container and show
# what is inside. (Later issues extend it: mount it with jlmfs and generate.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
make -j2 all >/dev/null
out=$(mktemp -d /tmp/jlmdemo.XXXXXX)
trap 'rm -rf "$out"' EXIT
./build/jlm convert models/stories260K.gguf -o "$out/stories260K.jlm"
./build/jlm info "$out/stories260K.jlm"
