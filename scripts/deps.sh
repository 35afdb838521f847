#!/usr/bin/env bash
# deps.sh - installs the Debian packages jlmfs needs to build and test, when
# any is missing. Idempotent; needs root (or sudo) only when it installs.
# Optional, not installed here: the CUDA toolkit (NVIDIA's, at /usr/local/cuda);
# when its nvcc exists the Makefile builds the CUDA kernels (docs/cuda.md).
set -euo pipefail
PKGS=(build-essential pkg-config libcriterion-dev libfuse3-dev fuse3 libsqlite3-dev sqlite3
      libjansson-dev libutf8proc-dev libstb-dev zlib1g-dev libmicrohttpd-dev curl xz-utils
      libedit-dev tmux   # jlm chat's line editing and history; tmux drives it in tests/test_cli_chat.c
      libvulkan-dev glslc mesa-vulkan-drivers   # Vulkan backend; lavapipe runs its tests on the CPU
      chromium)   # chromium: tests/test_picture.c renders `jlm info --html` headless
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "deps: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
