#!/usr/bin/env bash
# Wheels of the harness's dependencies that a bare GPU image may lack (one with PyTorch,
# TensorBoard, psutil, numpy, matplotlib and prometheus-client already in it), for a machine
# that cannot fetch them: saved into .whl/ here (git-ignored), installed there by
# launch/gpu_check.sh.
# Usage: bash launch/gpu_wheels.sh [python-version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${1:-3.12}
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl msgspec google-crc32c plotly torch-tb-profiler nvidia-ml-py
ls -1 .whl
