// oomb trainer — scalar conversions and the few vector kernels every CPU op is built from.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU ops are the oracle the GPU kernels are checked against, so their summation order is
// fixed by the source: they use the library's fixed-order reductions (oomb/core/fixed_order.hpp),
// the same ones the attention reference (oomb/attention/reference.hpp) is built from.
#pragma once

#include <oomb/core/fixed_order.hpp>

namespace oomb_trainer::cpu {

using oomb::fixed_order::axpy;
using oomb::fixed_order::axpy_store;
using oomb::fixed_order::dot;
using oomb::fixed_order::lanes;
using oomb::fixed_order::load;
using oomb::fixed_order::store;

}  // namespace oomb_trainer::cpu
