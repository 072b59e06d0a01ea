#!/usr/bin/env bash
# Set up everything expertbench needs on a Debian/Ubuntu machine: the system packages for building the
# native core (a C compiler, make, Python headers, venv), then a virtual environment in .venv with the
# project installed in editable mode (which compiles the core and the CPU runtime module).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cc >/dev/null || need+=(build-essential)
command -v make >/dev/null || need+=(make)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null ||
    need+=(python3-dev)
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

if [ "${EXPERTBENCH_NO_GPU:-}" != 1 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || command -v hipcc >/dev/null; }; then
    echo "building the GPU modules too (nvcc/hipcc found; CUDA's four architectures take about 4 minutes):" \
        "EXPERTBENCH_NO_GPU=1 skips them, EXPERTBENCH_CUDA_ARCHS=\"90\" builds one architecture"
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "set up: .venv (run .venv/bin/expertbench run)"
