// oomb — the attention layer's product kernels, compiled once for oomb's own targets.
// SPDX-License-Identifier: Apache-2.0
//
// The library stays header-only: a program may include oomb/attention/attention.cuh anywhere and
// get every kernel it launches. oomb's trainer, tests and benchmarks launch attention from many
// translation units, each of which would compile all twelve configurations again (the largest part
// of the CUDA build); they link oomb::attention_kernels instead, which compiles them here and makes
// the others see only declarations (OOMB_ATTENTION_EXTERN_INSTANCES). A project of its own can do
// the same with one file like this one.
#include <oomb/attention/attention.cuh>

OOMB_NAMESPACE_BEGIN
namespace attention::detail {
OOMB_ATTENTION_INSTANCES(template)
}  // namespace attention::detail
OOMB_NAMESPACE_END
