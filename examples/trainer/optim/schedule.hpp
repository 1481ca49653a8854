// oomb trainer — learning-rate schedule: linear warm-up, then cosine decay to a minimum.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>

#include "oomb/core/error.hpp"

namespace oomb_trainer {

/// lr(step), steps counted from 0:
///   step <  warmup            : max_lr * (step + 1) / warmup          (reaches max_lr at warmup - 1)
///   warmup <= step < total    : min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
///   step >= total             : min_lr
class cosine_schedule {
 public:
  cosine_schedule(double max_lr, double min_lr, std::int64_t warmup_steps, std::int64_t total_steps)
      : max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
    OOMB_EXPECTS(std::isfinite(max_lr) && max_lr >= 0, "cosine_schedule: max_lr must be >= 0, got ", max_lr);
    OOMB_EXPECTS(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr,
                 "cosine_schedule: min_lr must be in [0, max_lr = ", max_lr, "], got ", min_lr);
    OOMB_EXPECTS(warmup_steps >= 0, "cosine_schedule: negative warm-up ", warmup_steps);
    OOMB_EXPECTS(total_steps >= warmup_steps, "cosine_schedule: total steps ", total_steps,
                 " shorter than the warm-up ", warmup_steps);
  }

  double operator()(std::int64_t step) const {
    OOMB_EXPECTS(step >= 0, "cosine_schedule: negative step ", step);
    if (step < warmup_) return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (step >= total_) return min_lr_;
    const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    const double pi = 3.14159265358979323846;
    return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(pi * progress));
  }

  double max_lr() const noexcept { return max_lr_; }
  double min_lr() const noexcept { return min_lr_; }
  std::int64_t warmup_steps() const noexcept { return warmup_; }
  std::int64_t total_steps() const noexcept { return total_; }

 private:
  double max_lr_, min_lr_;
  std::int64_t warmup_, total_;
};

}  // namespace oomb_trainer
