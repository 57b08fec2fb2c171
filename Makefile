# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lit bench federated-demo clean

# No CPU build of torchvision for torch 2.13 is to be had here, and PyPI's (a CUDA build, which timm
# needs and transformers then imports) dies at import beside the CPU torch: where it does, the venv
# gets tools/torchvision_without_ops.pth (its comment says what it does), so that torchvision, timm
# and transformers import in every script run in the venv, as the guides' examples are written.
TORCHVISION_PTH := tools/torchvision_without_ops.pth

# jax2onnx needs a newer onnx than the venv's: it goes to a directory of its own, which only
# examples/jax_via_onnx.py's converter process puts on its path (that file says why).
JAX2ONNX_REQUIREMENTS := examples/jax2onnx-requirements.txt
# So does onnxscript, torch.onnx.export(dynamo=True)'s, for tests/onnx_dynamo_export.py's process.
ONNXSCRIPT_REQUIREMENTS := tests/onnxscript-requirements.txt

$(STAMP): pyproject.toml $(TORCHVISION_PTH) $(JAX2ONNX_REQUIREMENTS) $(ONNXSCRIPT_REQUIREMENTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	$(VENV)/bin/pip install --quiet --no-deps --upgrade --target $(VENV)/jax2onnx -r $(JAX2ONNX_REQUIREMENTS)
	$(VENV)/bin/pip install --quiet --no-deps --upgrade --target $(VENV)/onnxscript -r $(ONNXSCRIPT_REQUIREMENTS)
	$(PY) -c 'import torchvision' 2>/dev/null || \
	    cp $(TORCHVISION_PTH) "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	$(PY) -c 'import torchvision, timm, transformers'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Lint and format are checked first (ruff, configured in pyproject.toml: docs/CONTRIBUTING.md).
# The device tests need qemu, lavapipe and IREE's aarch64 runtime; the script installs them or says
# why not (those tests then skip; -rs prints the reasons). Two workers, each test file in one of them
# (its compiled-once fixtures stay in one process): most of the suite's time is single-threaded
# export and passes, which the second core would otherwise leave idle. Files start in the order
# tests/conftest.py sets (longest first), not xdist's default of the most tests first; the slowest
# tests are listed, for keeping the run within its time budget (docs/CONTRIBUTING.md).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	sh tools/setup_device_deps.sh $(PY)
	$(PY) -m pytest -rs -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

# Sparse and full-model FedAvg of the vision task on a local Flower federation, against centralised
# fine-tuning (docs/federated.md); that guide's table is examples/quality/federated.py's.
federated-demo: $(STAMP)
	$(PY) examples/quality/federated.py --out federated_demo

lit: $(STAMP)
	$(VENV)/bin/lit -v lit_tests

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .cache
