#!/usr/bin/env bash
# deps.sh - installs the Debian packages jlmfs needs to build and test, when
# any is missing. Idempotent; needs root (or sudo) only when it installs.
# Optional, not installed here: the CUDA toolkit (NVIDIA's, at /usr/local/cuda);
# when its nvcc exists the Makefile builds the CUDA kernels (docs/cuda.md).
set -euo pipefail
PKGS=(build-essential pkg-config libcriterion-dev libfuse3-dev fuse3 libsqlite3-dev sqlite3
      libjansson-dev libutf8proc-dev libmicrohttpd-dev curl xz-utils
      libpng-dev libjpeg62-turbo-dev   # image decoding (engine/image.c)
      libstb-dev   # the tests write PNG and JPEG files with stb_image_write
      bash-completion   # extglob and compopt for scripts/completion/jlm (its model patterns need extglob)
      libedit-dev tmux   # jlm chat's line editing and history; tmux drives it in tests/test_cli_chat.c
      libvulkan-dev glslc mesa-vulkan-drivers   # Vulkan backend; lavapipe runs its tests on the CPU
      clang libclang-rt-14-dev   # make fuzz: the libFuzzer targets (ASan + UBSan), run by .ci/run
      chromium    # chromium: tests/test_picture.c renders `jlm info --html` headless
      graphviz    # dot: scripts/include-graph.sh draws docs/img/architecture.svg (checked by .ci/run)
      glusterfs-server glusterfs-client   # tests/twohost.sh: two hosts (netns) share a cache on a GlusterFS volume
      libxxhash-dev   # xxhash.h: XXH3-64 page checksums (format/sums.c, docs/checksums.md), inlined, no link
      nodejs)     # node (+ npm below): tests/test_serve.c drives `jlm serve` with the official openai client
missing=()
# Debian's nodejs needs its npm package; NodeSource's nodejs bundles npm and conflicts with it
command -v npm >/dev/null || PKGS+=(npm)
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The `openai` npm package for serve/the_openai_npm_client_gets_what_jlm_run_gives,
# installed outside the repository (nothing fetched is committed). Pinned: the
# 7.x line needs node >= 22, Debian bookworm/trixie ship node 18/20. Without
# it (no network) that test skips with one line.
NODE_DIR=/opt/jlm-test-node
OPENAI_VERSION=6.30.1
if command -v npm >/dev/null &&
   ! grep -qs "\"version\": \"$OPENAI_VERSION\"" "$NODE_DIR/node_modules/openai/package.json"; then
    echo "deps: installing the openai npm package $OPENAI_VERSION into $NODE_DIR" >&2
    { $SUDO mkdir -p "$NODE_DIR" &&
      $SUDO npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" "openai@$OPENAI_VERSION" >&2; } ||
        echo "deps: npm install openai failed: the OpenAI client test will skip" >&2
fi

# The `@anthropic-ai/sdk` and `ollama` npm packages for tests/test_serve.c (serve_apis)
# (serve's /v1/messages and /api/... through their official clients), beside
# openai in the same folder; pinned versions that run on node 18/20. Without
# them that suite's client tests skip with one line.
ANTHROPIC_VERSION=0.71.0
OLLAMA_JS_VERSION=0.6.4
if command -v npm >/dev/null &&
   { ! grep -qs "\"version\": \"$ANTHROPIC_VERSION\"" "$NODE_DIR/node_modules/@anthropic-ai/sdk/package.json" ||
     ! grep -qs "\"version\": \"$OLLAMA_JS_VERSION\"" "$NODE_DIR/node_modules/ollama/package.json"; }; then
    echo "deps: installing @anthropic-ai/sdk $ANTHROPIC_VERSION and ollama $OLLAMA_JS_VERSION into $NODE_DIR" >&2
    { $SUDO mkdir -p "$NODE_DIR" &&
      $SUDO npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" "openai@$OPENAI_VERSION" \
          "@anthropic-ai/sdk@$ANTHROPIC_VERSION" "ollama@$OLLAMA_JS_VERSION" >&2; } ||
        echo "deps: npm install of the Anthropic and ollama clients failed: their tests will skip" >&2
fi
