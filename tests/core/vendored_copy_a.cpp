// One of two renamed copies of oomb in test_core (see test_vendoring.cpp): this translation unit
// sees oomb as oomb_vendor_a. Any header that names ::oomb directly fails to compile here.
// SPDX-License-Identifier: Apache-2.0
#define OOMB_NAMESPACE oomb_vendor_a
#include "vendored_copy.hpp"
