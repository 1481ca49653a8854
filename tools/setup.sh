#!/usr/bin/env bash
# Installs everything a fresh Debian 12 machine needs to build, test and benchmark oomb.
# Idempotent: packages already present are left alone. Needs root (or sudo).
# The CUDA toolkit (nvcc 13.0) is not a Debian package: install it from NVIDIA; without it the
# CPU parts build and test, and `.ci/run` fails loudly at its CUDA phase.
set -euo pipefail
packages=(cmake ninja-build g++ make git pkg-config python3
          libfmt-dev doctest-dev libbenchmark-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
