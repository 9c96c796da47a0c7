PYTHON ?= python3
export CUDA_HOME ?= $(shell [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda)

BUILD_DEPS = setuptools wheel ninja packaging pybind11 nvidia-cutlass==4.2.0.0 pytest

.PHONY: install build test bench kernels check clean

# Installs the build requirements (torch only if missing), then builds the extension in place.
install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch
	$(PYTHON) -m pip install $(BUILD_DEPS)
	$(MAKE) build

build:
	$(PYTHON) -m pip install --no-build-isolation --no-deps -v -e .

test:
	$(PYTHON) -m pytest tests -q -rs

bench:
	$(PYTHON) benchmarks/benchmark_attn.py --json

kernels:
	$(PYTHON) csrc/generate_kernels.py

check:
	$(PYTHON) csrc/generate_kernels.py --check
	$(MAKE) test

clean:
	rm -rf build *.egg-info flash_attn_cuda/*.so
