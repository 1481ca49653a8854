// oomb trainer — learning-rate schedules: linear warm-up, then cosine or linear decay to a minimum,
// or constant.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "oomb/core/error.hpp"

namespace oomb_trainer {

/// What the learning rate does after the warm-up.
enum class lr_schedule_kind {
  cosine,    ///< half a cosine from max_lr down to min_lr
  linear,    ///< a straight line from max_lr down to min_lr
  constant,  ///< max_lr throughout (min_lr unused)
};

inline const char* lr_schedule_name(lr_schedule_kind k) noexcept {
  return k == lr_schedule_kind::cosine ? "cosine" : k == lr_schedule_kind::linear ? "linear" : "constant";
}

/// "cosine", "linear" or "constant"; anything else throws oomb::invalid_argument naming `what`.
inline lr_schedule_kind parse_lr_schedule(const std::string& text, const std::string& what = "--schedule") {
  if (text == "cosine") return lr_schedule_kind::cosine;
  if (text == "linear") return lr_schedule_kind::linear;
  if (text == "constant") return lr_schedule_kind::constant;
  OOMB_FAIL(oomb::invalid_argument, what, ": '", text, "' is not cosine, linear or constant");
}

/// lr(step), steps counted from 0:
///   step <  warmup            : max_lr * (step + 1) / warmup          (reaches max_lr at warmup - 1)
///   warmup <= step < total    : cosine   min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2
///                               linear   min_lr + (max_lr - min_lr) * (1 - p)
///                               constant max_lr
///                               with p = (step - warmup) / (total - warmup)
///   step >= total             : min_lr (constant: max_lr)
class lr_schedule {
 public:
  lr_schedule(lr_schedule_kind kind, double max_lr, double min_lr, std::int64_t warmup_steps, std::int64_t total_steps)
      : kind_(kind), max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
    OOMB_EXPECTS(std::isfinite(max_lr) && max_lr >= 0, "lr schedule: max_lr must be >= 0, got ", max_lr);
    OOMB_EXPECTS(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr,
                 "lr schedule: min_lr must be in [0, max_lr = ", max_lr, "], got ", min_lr);
    OOMB_EXPECTS(warmup_steps >= 0, "lr schedule: negative warm-up ", warmup_steps);
    OOMB_EXPECTS(total_steps >= warmup_steps, "lr schedule: total steps ", total_steps,
                 " shorter than the warm-up ", warmup_steps);
  }

  double operator()(std::int64_t step) const {
    OOMB_EXPECTS(step >= 0, "lr schedule: negative step ", step);
    if (step < warmup_) return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (kind_ == lr_schedule_kind::constant) return max_lr_;
    if (step >= total_) return min_lr_;
    const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    if (kind_ == lr_schedule_kind::linear) return min_lr_ + (max_lr_ - min_lr_) * (1.0 - progress);
    const double pi = 3.14159265358979323846;
    return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(pi * progress));
  }

  lr_schedule_kind kind() const noexcept { return kind_; }
  double max_lr() const noexcept { return max_lr_; }
  double min_lr() const noexcept { return min_lr_; }
  std::int64_t warmup_steps() const noexcept { return warmup_; }
  std::int64_t total_steps() const noexcept { return total_; }

 private:
  lr_schedule_kind kind_;
  double max_lr_, min_lr_;
  std::int64_t warmup_, total_;
};

}  // namespace oomb_trainer
