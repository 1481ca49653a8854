// The second renamed copy of oomb in test_core (see test_vendoring.cpp): oomb_vendor_b.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_NAMESPACE oomb_vendor_b
#include "vendored_copy.hpp"
