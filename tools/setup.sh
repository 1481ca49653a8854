#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs everything a fresh Debian 12 machine needs to build, test and benchmark oomb:
# the compiler, CMake, Ninja, Python 3 (doc checks), Debian's doctest, Google Benchmark, fmt,
# nlohmann-json and dlpack.h (libdlpack-dev: only the tests and examples of oomb/interop/dlpack.hpp
# use it; the library never ships or needs a copy).
# Idempotent: when everything is present it changes nothing and asks no network.
# Runs as root, or through sudo otherwise.
# The CUDA toolkit (nvcc 13.0) is not a Debian package: install it from NVIDIA. Without it the CPU
# parts build and test, and tools/test.sh fails loudly at its cuda phase.
set -euo pipefail

packages=(cmake ninja-build g++ make git pkg-config python3 tar gzip
          libfmt-dev doctest-dev libbenchmark-dev nlohmann-json3-dev libdlpack-dev)

command -v dpkg-query >/dev/null || {
  echo "setup: this script is for Debian (12) and its derivatives; install by hand:" \
       "${packages[*]}" >&2
  exit 1
}
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: not root and no sudo: cannot install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA compiler: $( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | head -1)"
else
  echo "setup: no nvcc: the CPU parts build and run; the CUDA side needs NVIDIA's CUDA toolkit"
fi

# ---------------------------------------------------------------------------------------------
# Python: the PyTorch package (python/, docs/pytorch.md) and its tests, in a virtual environment
# (Debian's own Python refuses pip installs). OOMB_VENV names it (default .venv in the repository);
# OOMB_SKIP_PYTHON=1 leaves this part out. The pins are python/requirements-dev.txt; a stamp in the
# venv holds their hash, so a second run with the same pins asks no network and changes nothing.
# Measured on the 2-core development machine: the venv with torch's CUDA wheel and its nvidia-*
# libraries takes about 60 s and 4.9 GB (docs/pytorch.md).
# ---------------------------------------------------------------------------------------------
if [ "${OOMB_SKIP_PYTHON:-0}" != 1 ]; then
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${OOMB_VENV:-$root/.venv}
  py=/usr/bin/python3  # Debian's, whatever python3 is first on PATH (pyenv and the like)
  [ -x "$py" ] || py=$(command -v python3)
  if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    echo "setup: installing python3-venv"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating the Python environment $venv"
    "$py" -m venv "$venv"
  fi
  req="$root/python/requirements-dev.txt"
  stamp="$venv/.oomb-requirements.sha256"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing python/requirements-dev.txt into $venv (torch's wheel: ~2.6 GB download)"
    py_start=$(date +%s)
    # No pip cache: it would keep a second copy of the 2.6 GB of wheels.
    "$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check -r "$req"
    echo "$want" >"$stamp"
    echo "setup: Python environment ready in $(($(date +%s) - py_start)) s ($(du -sh "$venv" | cut -f1))"
  else
    echo "setup: Python environment $venv up to date"
  fi
  # The package itself, once (tools/test.sh reinstalls it from the tree before its tests). Its GPU
  # library is left out (OOMB_PYTHON_CUDA=OFF): these machines have nvcc but no GPU, the kernels
  # take minutes to compile, and oomb's CUDA build compiles the same library (oomb_python_cuda).
  if ! "$venv/bin/python" -c "import oomb" 2>/dev/null; then
    echo "setup: installing the oomb package (pip install ./python, CPU path)"
    "$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check \
      --no-build-isolation --no-deps --config-settings=cmake.define.OOMB_PYTHON_CUDA=OFF "$root/python"
  fi
fi
