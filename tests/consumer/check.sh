#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs tests/consumer — a program outside oomb's tree — against oomb the ways a user
# gets it: find_package(oomb CONFIG) against an install (moved after installing: the package is
# relocatable), pkg-config against the same install, add_subdirectory of the source, and
# FetchContent from a local archive of the source. Where nvcc is found, the package and
# add_subdirectory consumers also build a CUDA program and a shared library against oomb::cuda,
# and the library must export none of oomb's header kernels. Fails on the first step that does.
# Usage: bash tests/consumer/check.sh [OOMB_SOURCE_DIR]   (default: this checkout)
set -euo pipefail

src=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
consumer="$src/tests/consumer"
work=$(mktemp -d "${TMPDIR:-/tmp}/oomb-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
version=$(sed -n 's/^#define OOMB_VERSION_STRING "\(.*\)"$/\1/p' "$src/include/oomb/core/version.hpp")
step() { printf '\n== consumer check: %s\n' "$*"; }
cuda=()
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
if command -v nvcc >/dev/null; then cuda=(-DOOMB_CONSUMER_CUDA=ON); fi
fail() { echo "consumer check FAILED: $*" >&2; exit 1; }

# Configures, builds and runs the consumer: build_consumer NAME [cmake args...]
build_consumer() {
  local name=$1; shift
  cmake -S "$consumer" -B "$work/$name" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >"$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; fail "$name: configure"; }
  cmake --build "$work/$name" >>"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: build"; }
  "$work/$name/consumer" || fail "$name: the program failed"
  if ((${#cuda[@]})) && [ -f "$work/$name/libconsumer_kernels.so" ]; then
    local lib="$work/$name/libconsumer_kernels.so" exported kernels='detail::sm_[0-9_]+::(page_copy_kernel|table_scatter_kernel|table_relayout_kernel)<'
    exported=$(nm -D --defined-only -C "$lib")
    grep -q consumer_copy_pages <<<"$exported" || fail "$name: nm does not list the library's own function"
    # The kernels are in the library, in their architecture-keyed namespace, but not exported.
    grep -Eq "$kernels" <<<"$(nm -C "$lib")" || fail "$name: no architecture-keyed oomb kernel in $lib"
    if grep -E "$kernels" <<<"$exported"; then
      fail "$name: libconsumer_kernels.so exports oomb's kernels (above)"
    fi
    echo "$name: oomb::cuda consumers built; the shared library holds oomb's kernels, keyed by architecture, and exports none"
  fi
}

step "install oomb $version into a staging prefix, then move it"
cmake -S "$src" -B "$work/oomb-build" "${generator[@]}" -DOOMB_ENABLE_CUDA=OFF \
  -DOOMB_BUILD_TESTS=OFF -DOOMB_BUILD_EXAMPLES=OFF -DOOMB_BUILD_BENCH=OFF -DOOMB_INSTALL=ON \
  -DCMAKE_INSTALL_PREFIX="$work/stage" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "configure oomb"; }
cmake --install "$work/oomb-build" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "install oomb"; }
mv "$work/stage" "$work/prefix"
prefix="$work/prefix"
for f in include/oomb/oomb.hpp include/oomb/core/version.hpp share/cmake/oomb/oombConfig.cmake \
         share/cmake/oomb/oombConfigVersion.cmake share/cmake/oomb/oombTargets.cmake \
         share/pkgconfig/oomb.pc share/doc/oomb/LICENSE; do
  [ -f "$prefix/$f" ] || fail "the install lacks $f"
done
echo "installed: $(cd "$prefix" && find . -type f | wc -l) files"

step "find_package(oomb $version CONFIG) against the moved install"
build_consumer package -DOOMB_CONSUMER_MODE=package -DCMAKE_PREFIX_PATH="$prefix" "${cuda[@]}"
step "find_package(oomb 99.0) must be refused"
if cmake -S "$consumer" -B "$work/package-99" "${generator[@]}" -DOOMB_CONSUMER_MODE=package \
     -DCMAKE_PREFIX_PATH="$prefix" -DOOMB_REQUIRED_VERSION=99.0 >"$work/package-99.log" 2>&1; then
  fail "find_package accepted version 99.0 of oomb $version"
fi
grep -q "considered but not accepted" "$work/package-99.log" || { cat "$work/package-99.log"; fail "unexpected error for 99.0"; }
echo "refused, as it should be"

step "pkg-config against the moved install"
export PKG_CONFIG_PATH="$prefix/share/pkgconfig"
[ "$(pkg-config --modversion oomb)" = "$version" ] || fail "pkg-config says $(pkg-config --modversion oomb), want $version"
incdir=$(pkg-config --variable=includedir oomb)
[ "$(realpath "$incdir")" = "$(realpath "$prefix/include")" ] || fail "pkg-config's includedir is $incdir, not $prefix/include"
case "$(pkg-config --cflags oomb)" in *"-I$incdir"*) ;; *) fail "pkg-config --cflags lacks -I$incdir";; esac
# shellcheck disable=SC2046
c++ -std=c++17 -Wall -Wextra -Werror "$consumer/main.cpp" $(pkg-config --cflags --libs oomb) -o "$work/pc-consumer" \
  || fail "pkg-config build"
"$work/pc-consumer" || fail "pkg-config program"
unset PKG_CONFIG_PATH

step "add_subdirectory($src), consumer in C++20"
build_consumer subdirectory -DOOMB_CONSUMER_MODE=subdirectory -DOOMB_SOURCE_DIR="$src" -DCMAKE_CXX_STANDARD=20 "${cuda[@]}"

step "FetchContent from a local archive of the source"
# The archive holds only what the library needs (CMake files, headers, licence): proof that a
# consumer's build never reaches into tests/, examples/ or bench/.
tar -C "$src" -czf "$work/oomb-$version.tar.gz" --transform "s,^,oomb-$version/," \
  CMakeLists.txt cmake include LICENSE
hash=$(sha256sum "$work/oomb-$version.tar.gz" | cut -d' ' -f1)
build_consumer fetchcontent -DOOMB_CONSUMER_MODE=fetchcontent \
  -DOOMB_URL="file://$work/oomb-$version.tar.gz" -DOOMB_URL_HASH="SHA256=$hash"

printf '\nconsumer check: find_package, pkg-config, add_subdirectory and FetchContent all work\n'
