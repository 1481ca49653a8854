// oomb trainer — token embedding: rows of a [vocab][hidden] table.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>

#include <oomb/core/error.hpp>

#include "trainer/cpu/common.hpp"

namespace oomb_trainer::cpu {

/// out[t] = table[tokens[t]] for t < n; out is [n][H]. Throws for a token outside [0, vocab).
template <class T>
void embedding_forward(std::int64_t n, std::int32_t H, std::int32_t vocab, const std::int32_t* tokens,
                       const T* table, T* out) {
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int32_t id = tokens[t];
    OOMB_EXPECTS(id >= 0 && id < vocab, "embedding: token ", id, " at position ", t, " is outside [0, ",
                 vocab, ")");
    std::copy(table + std::int64_t(id) * H, table + std::int64_t(id + 1) * H, out + t * H);
  }
}

/// dtable[tokens[t]] += dout[t] (tokens were checked by the forward).
template <class T>
void embedding_backward(std::int64_t n, std::int32_t H, const std::int32_t* tokens, const T* dout, T* dtable) {
  for (std::int64_t t = 0; t < n; ++t) axpy(H, T(1), dout + t * H, dtable + std::int64_t(tokens[t]) * H);
}

}  // namespace oomb_trainer::cpu
