#!/usr/bin/env bash
# The Python packages l2gen needs that a GPU machine without a package index may lack, as
# wheels in .whl/ (bench/device.sh installs .whl/*.whl before its steps). Run where pip
# reaches an index:   bash bench/fetch_wheels.sh [PYTHON_VERSION]   (default 3.12)
# torch, numpy and jinja2 are expected there already.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "lark>=1.1.9" "nvidia-cutlass>=4.2,<5" rich markdown-it-py mdurl pygments \
  hypothesis sortedcontainers pytest pluggy iniconfig
ls .whl
