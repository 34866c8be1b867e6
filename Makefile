# The two commands: `make demo` (train, evaluate and prune a zoo member on built-in data) and `make test`.
# Both bootstrap .venv idempotently. torch==2.13.0 (the CPU wheel) is installed only when no torch imports,
# so a CUDA build installed into .venv beforehand is kept.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zoo-bootstrapped
DEMO_DIR ?= runs/demo

.PHONY: bootstrap peer bench-peers test test-slow test-configs test-release test-all test-vision vision vision-bench lint demo benchmarks docs docs-check gpu-check clean

bootstrap: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null && echo "keeping the installed torch" || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# laplace-torch, the peer the subnetwork Laplace tests compare with (they skip without it). Installed against the
# torch already in .venv (pinned, so pip cannot replace it); the torchvision it drags in is CUDA-only on PyPI and
# breaks `import laplace` on a CPU torch, and neither laplace nor backpack uses it, so it is removed again there.
peer: $(STAMP)
	$(PY) -c 'import torch; print("torch==" + torch.__version__)' > $(VENV)/torch-pin.txt
	$(PY) -m pip install -q -c $(VENV)/torch-pin.txt -e '.[peer]'
	@$(PY) -c 'import torchvision' 2>/dev/null || $(PY) -m pip uninstall -q -y torchvision
	$(PY) -c 'import laplace; print("laplace-torch", laplace.__version__ if hasattr(laplace, "__version__") else "ok")'

# The samplers benchmarks/hmc_speed.py compares the zoo's HMC with (NumPyro, BlackJAX, nutpie with PyMC), so that
# the tests pinning their models to the zoo's potential run (they skip without them). Against .venv's torch, pinned.
bench-peers: $(STAMP)
	$(PY) -c 'import torch; print("torch==" + torch.__version__)' > $(VENV)/torch-pin.txt
	$(PY) -m pip install -q -c $(VENV)/torch-pin.txt -e '.[bench,nutpie]'

# The suite runs in TEST_WORKERS processes (pytest-xdist; each test file on one worker, so a file's module fixtures
# are built once); the tests set torch to one thread each. `make test` leaves out the tests marked slow (over ~15 s:
# notebooks, benchmarks end to end, kill-and-resume subprocesses, torchrun, torch.compile), which `make test-slow`
# runs (test by test across the workers: the notebooks are one file, and its tests would otherwise queue on one
# worker); CI runs both. The 25 slowest durations close each log.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

test: $(STAMP)
	$(PY) -m ruff check zoo guides tests benchmarks notebooks docs/hooks.py docs/check_site.py
	$(VENV)/bin/lint-imports
	$(PYTEST)

test-slow: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load --durations=25 -m slow

# every shipped toy config trained by `zoo train` at its defaults, each must exit 0 (the NUTS ones excepted: tens of
# minutes per chain, as their headers say); a few minutes, so it is its own step of CI rather than part of `make test`
test-configs: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load --durations=25 -m configs tests/test_shipped_configs.py

# the release (issue 52; .ci/check_release): the sdist and the wheel built, the wheel installed into a fresh venv
# (torch 2.13.0 first, pinned) and the README's YAML quick start run at small size from a folder outside the
# repository, on the shipped configs; then the sdist installed in its place. A few minutes; the registry is needed.
test-release: $(STAMP)
	$(PY) .ci/check_release --python $(PYTHON)

# The vision set-up: torchvision does not import beside the 2.13.0 CPU wheel, so the vision tests (pytest -m vision:
# torchvision architectures by name, the MNIST/FashionMNIST readers) run in their own venv with the torch 2.14.1 +
# torchvision 0.29.1 pair (a CUDA build that also runs on the CPU; ~2.5 min and 5.5 GB to set up here). A CUDA
# user whose .venv already holds a matching torch/torchvision pair can run `pytest -m vision` there instead.
VISION_VENV ?= .venv-vision
VPY := $(VISION_VENV)/bin/python
VSTAMP := $(VISION_VENV)/.zoo-bootstrapped

vision: $(VSTAMP)

$(VSTAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VISION_VENV)
	@$(VPY) -c "import torchvision" 2>/dev/null && echo "keeping the installed torch/torchvision" || \
		$(VPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(VPY) -m pip install -q -e '.[dev,vision]'
	@touch $(VSTAMP)

test-vision: $(VSTAMP)
	$(VPY) -m pytest -q -m vision

# bayesian-torch, the peer of benchmarks/conv_speed.py, in the vision venv against its torch (pinned, so pip keeps it)
vision-bench: $(VSTAMP)
	$(VPY) -c 'import torch, torchvision; print(f"torch=={torch.__version__}\ntorchvision=={torchvision.__version__}")' \
		> $(VISION_VENV)/torch-pin.txt
	$(VPY) -m pip install -q -c $(VISION_VENV)/torch-pin.txt -e '.[vision-bench]'

# The documentation site (mkdocs.yml): strict, so a broken link, anchor or API reference fails the build; into
# build/site. The spec and CLI references are generated from the code (docs/hooks.py).
DOCS_STAMP := $(VENV)/.zoo-docs
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The built site served on localhost and every page opened in headless Chromium (Debian's chromium and
# chromium-driver, installed here when missing): console errors, missing images and broken internal links fail it;
# screenshots of the front page and a tutorial go to build/site-check/
docs-check: docs
	@command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)
	$(PY) docs/check_site.py build/site --screenshots build/site-check

# The GPU check (benchmarks/gpu_check.py): the CUDA tests and the GPU benchmarks (SVI step eager and compiled against
# hand-written, bf16 autocast, ResNet-20 members, the DataLoader path, many-chain HMC at 64 / 512 / 4,096 chains,
# NCCL collectives) in one command, one JSON + Markdown report in $(GPU_CHECK_DIR), rewritten after every case and
# opening with a summary table. On a GPU machine: `make gpu-check` (planned at 8 minutes on an H100/H200; no new case
# after 450 s); DEVICE=cpu runs every section at tiny sizes on the CPU, a smoke test (CI's).
DEVICE ?= cuda
GPU_CHECK_DIR ?= build/gpu-check
gpu-check: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/gpu_check.py --device $(DEVICE) --out $(GPU_CHECK_DIR)

test-all: $(STAMP)
	$(PYTEST) -m "slow or not slow"

lint: $(STAMP)
	$(PY) -m ruff check zoo guides tests benchmarks notebooks docs/hooks.py docs/check_site.py
	$(VENV)/bin/lint-imports

demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/zoo train configs/mean_field_toy.yaml --out $(DEMO_DIR)/mean_field_toy
	$(VENV)/bin/zoo train configs/mean_field_digits.yaml --out $(DEMO_DIR)/mean_field_digits
	$(VENV)/bin/zoo prune $(DEMO_DIR)/mean_field_digits --fractions 0.5,0.75,0.95,0.98
	$(VENV)/bin/zoo train configs/rank1_cauchy_digits.yaml --out $(DEMO_DIR)/rank1_cauchy_digits

clean:
	rm -rf runs build .cache .pytest_cache .ruff_cache
