// oomb trainer — RoPE's frequencies: inv_freq[i] for each pair of dimensions and the factor on
// cos and sin, for each rope_kind, computed in double by transformers' formulas
// (modeling_rope_utils.py, _compute_*_parameters; transformers computes them in fp32).
// SPDX-License-Identifier: Apache-2.0
//
// The angle of pair i at position p is p * inv_freq[i]; cos and sin are multiplied by
// attention_factor (yarn and longrope temper the attention's logits this way) and rounded to fp32
// (cpu/rope.hpp). longrope takes its long factors when the sequence is longer than the
// pre-training length and its short ones otherwise, as transformers decides per forward call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <oomb/core/error.hpp>

#include "trainer/io/rope_config.hpp"

namespace oomb_trainer {

/// What a RoPE table is made from.
struct rope_frequencies {
  std::vector<double> inv_freq;   ///< [head_dim / 2]
  double attention_factor = 1.0;  ///< on cos and sin
  std::int32_t head_dim() const noexcept { return static_cast<std::int32_t>(2 * inv_freq.size()); }
};

/// The frequencies of `r` for heads of `head_dim` dimensions and a sequence of `seq_len` tokens
/// (only longrope reads it).
inline rope_frequencies rope_frequencies_for(const rope_config& r, std::int32_t head_dim, std::int64_t seq_len) {
  OOMB_EXPECTS(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even and positive, got ", head_dim);
  OOMB_EXPECTS(r.theta > 0, "rope: theta must be positive, got ", r.theta);
  const std::int32_t half = head_dim / 2;
  const double d = double(head_dim);
  rope_frequencies f;
  f.inv_freq.resize(static_cast<std::size_t>(half));
  std::vector<double> base(f.inv_freq.size());  // theta^(-2i/d): plain RoPE
  for (std::int32_t i = 0; i < half; ++i) base[std::size_t(i)] = 1.0 / std::pow(r.theta, double(2 * i) / d);
  const double pi = 3.14159265358979323846;
  const double orig = double(r.original_max_position_embeddings);
  switch (r.kind) {
    case rope_kind::plain:
      f.inv_freq = base;
      break;
    case rope_kind::linear:
      for (std::size_t i = 0; i < base.size(); ++i) f.inv_freq[i] = base[i] / r.factor;
      break;
    case rope_kind::llama3: {
      // Long wavelengths (beyond the pre-training length / low_freq_factor) are interpolated by
      // factor, short ones (below length / high_freq_factor) kept, the band between blended.
      const double low_wavelen = orig / r.low_freq_factor, high_wavelen = orig / r.high_freq_factor;
      for (std::size_t i = 0; i < base.size(); ++i) {
        const double wavelen = 2 * pi / base[i];
        if (wavelen > low_wavelen) {
          f.inv_freq[i] = base[i] / r.factor;
        } else if (wavelen < high_wavelen) {
          f.inv_freq[i] = base[i];
        } else {
          const double smooth = (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f.inv_freq[i] = (1 - smooth) * base[i] / r.factor + smooth * base[i];
        }
      }
      break;
    }
    case rope_kind::yarn: {
      // Dimensions that turn fewer than beta_slow times over the pre-training length are
      // interpolated, more than beta_fast times extrapolated, a linear ramp between.
      auto correction_dim = [&](double rotations) {
        return d * std::log(orig / (rotations * 2 * pi)) / (2 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, d - 1);
      if (low == high) high += 0.001;  // as transformers: no division by zero
      for (std::size_t i = 0; i < base.size(); ++i) {
        const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;
        f.inv_freq[i] = base[i] / r.factor * (1 - extrapolation) + base[i] * extrapolation;
      }
      auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      if (r.attention_factor)
        f.attention_factor = *r.attention_factor;
      else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0)
        f.attention_factor = mscale(r.factor, *r.mscale) / mscale(r.factor, *r.mscale_all_dim);
      else
        f.attention_factor = mscale(r.factor, 1.0);
      break;
    }
    case rope_kind::longrope: {
      const auto& ext = seq_len > r.original_max_position_embeddings ? r.long_factor : r.short_factor;
      OOMB_EXPECTS(ext.size() == base.size(), "rope: longrope has ", ext.size(), " factors for ", base.size(),
                   " frequencies");
      for (std::size_t i = 0; i < base.size(); ++i) f.inv_freq[i] = base[i] / ext[i];
      if (r.attention_factor)
        f.attention_factor = *r.attention_factor;
      else
        f.attention_factor = r.factor <= 1 ? 1.0 : std::sqrt(1 + std::log(r.factor) / std::log(orig));
      break;
    }
  }
  return f;
}

/// Plain RoPE of base `theta` (tests and benchmarks that need no config).
inline rope_frequencies plain_rope_frequencies(std::int32_t head_dim, double theta) {
  rope_config r;
  r.theta = theta;
  return rope_frequencies_for(r, head_dim, 0);
}

}  // namespace oomb_trainer
