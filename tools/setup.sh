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
