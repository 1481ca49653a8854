// oomb — version macros and the versioned inline namespace.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#define OOMB_VERSION_MAJOR 0
#define OOMB_VERSION_MINOR 1
#define OOMB_VERSION_PATCH 0
/// One number that orders releases: major * 10000 + minor * 100 + patch.
#define OOMB_VERSION (OOMB_VERSION_MAJOR * 10000 + OOMB_VERSION_MINOR * 100 + OOMB_VERSION_PATCH)
#define OOMB_VERSION_STRING "0.1.0"

// Everything lives in oomb::v0 (inline), so two vendored copies of different major versions can be
// linked into one program without violating the one-definition rule. Bump with the major version.
#define OOMB_NAMESPACE_BEGIN \
  namespace oomb {           \
  inline namespace v0 {
#define OOMB_NAMESPACE_END \
  }                        \
  }
