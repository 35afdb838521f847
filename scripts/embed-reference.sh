#!/bin/sh
# embed-reference.sh - records what llama.cpp's llama-embedding computes for
# the embedding test models into tests/reference/embeddings-MODEL.json (read
# by serve_apis/jlm_run_embeddings_agree_with_llama_embedding; the suite never
# runs llama.cpp itself). One run per model, pooling and prompt:
#   llama-embedding -m tests/models/MODEL.gguf -p PROMPT --pooling POOL
#       --embd-normalize 2 --embd-output-format array -t 1 -c 512
# (--embd-normalize 2: Euclidean, as jlm's vectors; the prompt tokenized
# with BOS, as jlm run does).
# Usage: scripts/embed-reference.sh LLAMA_BIN_DIR [COMMIT]
set -eu
bin=${1:?usage: scripts/embed-reference.sh LLAMA_BIN_DIR [COMMIT]}
commit=${2:-84f7129}
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$(dirname "$0")/.."
for model in stories260K synth-gemma3-256.Q8_0; do
    out=tests/reference/embeddings-$model.json
    {
        printf '{"llama_cpp_commit": "%s", "model": "%s.gguf",\n "runs": [' "$commit" "$model"
        sep=""
        for pool in mean last; do
            for prompt in "Once upon a time" "The little dog"; do
                cmd="llama-embedding -m tests/models/$model.gguf -p '$prompt' --pooling $pool --embd-normalize 2 --embd-output-format array -t 1 -c 512"
                # llama.cpp's logger thread may exit before it wrote the whole
                # array to a pipe: a run whose output is not one whole array
                # is repeated (at most 5 times)
                for try in 1 2 3 4 5; do
                    vec=$("$bin/llama-embedding" -m "tests/models/$model.gguf" -p "$prompt" --pooling "$pool" \
                          --embd-normalize 2 --embd-output-format array -t 1 -c 512 2>/dev/null)
                    printf '%s' "$vec" | python3 -c 'import json,sys; v=json.load(sys.stdin); assert len(v) == 1 and len(v[0]) > 0' 2>/dev/null && break
                    [ "$try" -lt 5 ] || { echo "embed-reference: $model $pool '$prompt': no whole array" >&2; exit 1; }
                done
                printf '%s\n  {"command": "%s", "pooling": "%s", "prompt": "%s", "embedding": %s}' \
                       "$sep" "$cmd" "$pool" "$prompt" "$(printf '%s' "$vec" | tr -d '\n ' | sed 's/^\[\[/[/; s/\]\]$/]/')"
                sep=","
            done
        done
        printf '\n]}\n'
    } > "$out.tmp"
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out.tmp"
    mv "$out.tmp" "$out"
    echo "wrote $out"
done
