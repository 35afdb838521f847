#!/usr/bin/env bash
# demo.sh - the README's main job on the bundled model: install what is
# missing, build, mount a temporary folder with jlmfs, drop the bundled GGUF in,
# generate text through the mounted .jlm view, show the pages the engine holds
# (resident/) and the statistics, unmount.
# One line per stage on stdout ("== [N/5] stage: what"), so the minutes a
# fresh machine spends in the first two are never silent.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { echo "== [$1/5] $2"; }
stage 1 "deps: the Debian packages jlmfs needs (scripts/deps.sh; installs only what is missing)"
./scripts/deps.sh
stage 2 "build: make -j2 all (a few minutes on a fresh machine; quiet unless it fails)"
make -j2 all >/dev/null
work=$(mktemp -d /tmp/jlmdemo.XXXXXX)
mkdir -p "$work/src" "$work/mnt"
cleanup() {
    exec 3>&- 2>/dev/null || true
    fusermount3 -u "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

stage 3 "mount: jlmfs $work/src on $work/mnt"
./build/jlmfs "$work/src" "$work/mnt"               # daemonizes; the cache lives in src/.jlmfs-cache
stage 4 "convert: the bundled stories260K.gguf dropped into the mount becomes the view stories260K.jlm"
cp models/stories260K.gguf "$work/mnt/"
view="$work/mnt/stories260K.jlm"
for _ in $(seq 100); do
    [ "$(cat "$view/status" 2>/dev/null)" = ready ] && break
    sleep 0.1
done
echo "== $view: $(cat "$view/status")"
ls "$view"

stage 5 "generate: jlm run through the mount"
./build/jlm run "$view" -p "Once upon a time" -n 48 --temp 0 --stats 2>"$work/run.err"   # stdout: exactly the text
echo; cat "$work/run.err"
echo

echo "== an engine holding the model open (jlm chat), and what resident/ shows meanwhile"
echo "   (stories260K is a story model, not a chat model: its reply continues the text in a chatml frame;"
echo "    the chat is here to keep an engine on the view while resident/ is listed)"
mkfifo "$work/in"
./build/jlm chat "$view" -n 16 --temp 0 < "$work/in" > "$work/chat.out" 2>/dev/null &
chat=$!
exec 3>"$work/in"
echo "The little dog" >&3
for _ in $(seq 100); do grep -q . "$work/chat.out" 2>/dev/null && break; sleep 0.1; done
sleep 0.2
echo "resident/: $(ls "$view/resident" | tr '\n' ' ')"
exec 3>&-
wait "$chat" || true
echo "chat replied: $(cat "$work/chat.out")"

echo "== stats"
cat "$view/stats"
