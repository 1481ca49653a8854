// oomb — version macros, the namespace a copy of oomb lives in, and the bounds-check switch.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#define OOMB_VERSION_MAJOR 0
#define OOMB_VERSION_MINOR 1
#define OOMB_VERSION_PATCH 0
/// One number that orders releases: major * 10000 + minor * 100 + patch.
#define OOMB_VERSION (OOMB_VERSION_MAJOR * 10000 + OOMB_VERSION_MINOR * 100 + OOMB_VERSION_PATCH)
#define OOMB_VERSION_STRING "0.1.0"

// The outer namespace: `oomb`, unless the includer renames its copy, e.g.
// -DOOMB_NAMESPACE=myframework_oomb on every translation unit that includes that copy. Two copies
// of the same version vendored by two libraries of one program then never share a symbol.
#ifndef OOMB_NAMESPACE
#define OOMB_NAMESPACE oomb
#endif

// Index checks in views and pools cost a branch per access: on in debug builds (no NDEBUG), or
// when the user defines OOMB_ENABLE_BOUNDS_CHECKS=1 (=0 turns them off). They throw on the host;
// device code never checks. Decided here, before the namespace below, because it names it.
#if !defined(OOMB_ENABLE_BOUNDS_CHECKS) && !defined(NDEBUG)
#define OOMB_ENABLE_BOUNDS_CHECKS 1
#endif

// Everything lives in an inline namespace named for the major version (oomb::v0), so copies of
// different major versions link into one program without breaking the one-definition rule. With
// bounds checks on it is v0_checked: an inline function compiled with checks and the same function
// compiled without are different symbols, so translation units that disagree on the switch never
// have one body silently replace the other at link time (passing oomb types between two such
// translation units fails to link instead). Bump with the major version.
#if OOMB_ENABLE_BOUNDS_CHECKS
#define OOMB_ABI_NAMESPACE v0_checked
#else
#define OOMB_ABI_NAMESPACE v0
#endif

#define OOMB_NAMESPACE_BEGIN   \
  namespace OOMB_NAMESPACE {   \
  inline namespace OOMB_ABI_NAMESPACE {
#define OOMB_NAMESPACE_END \
  }                        \
  }
