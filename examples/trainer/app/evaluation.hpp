// oomb trainer — evaluation by position: a forward-only pass's per-token losses
// (trainer::evaluate) summed over held-out sequences, overall and by the predicted token's position
// in its sequence, the signal long-context training exists for.
// SPDX-License-Identifier: Apache-2.0
//
// Buckets: [0, 4K), [4K, 32K), [32K, 128K), [128K, 1M), [1M, ...) tokens. "Answer accuracy"
// (kv-recall) is the share of counted predictions given more than half the probability (loss <
// ln 2): a lower bound of argmax accuracy that needs nothing but the loss, on every device.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <oomb/core/error.hpp>

namespace oomb_trainer {

/// A range of positions the evaluation reports on its own.
struct position_bucket {
  const char* name;
  std::int64_t first, end;  ///< positions [first, end) of the predicted token
};
inline constexpr std::array<position_bucket, 5> position_buckets{{{"0-4K", 0, 4096},
                                                                  {"4K-32K", 4096, 32768},
                                                                  {"32K-128K", 32768, 131072},
                                                                  {"128K-1M", 131072, 1048576},
                                                                  {"1M+", 1048576, std::numeric_limits<std::int64_t>::max()}}};

/// Losses of an evaluation, summed over its sequences.
struct evaluation {
  double loss_sum = 0;
  std::int64_t predictions = 0;  ///< counted predictions
  std::array<double, position_buckets.size()> bucket_loss{};
  std::array<std::int64_t, position_buckets.size()> bucket_predictions{};
  std::int64_t confident = 0;  ///< counted predictions with p(target) > 1/2
  std::int32_t sequences = 0;
  double seconds = 0;

  /// Adds one sequence's losses: entry t is the loss of predicting token t + 1 (NaN: not counted).
  /// `position` (optional, one per token): token j's position in its document; without it, j.
  void add(const std::vector<double>& row_loss, const std::vector<std::int64_t>* position = nullptr) {
    OOMB_EXPECTS(position == nullptr || position->size() == row_loss.size(), "evaluation: ", position ? position->size() : 0,
                 " positions for ", row_loss.size(), " tokens");
    const double ln2 = std::log(2.0);
    for (std::size_t t = 0; t < row_loss.size(); ++t) {
      const double l = row_loss[t];
      if (std::isnan(l)) continue;
      OOMB_CHECK(std::isfinite(l), oomb::error, "evaluation: the loss predicting token ", t + 1, " is not finite (", l, ")");
      loss_sum += l;
      ++predictions;
      if (l < ln2) ++confident;
      const std::int64_t pos = position && t + 1 < position->size() ? (*position)[t + 1] : std::int64_t(t) + 1;
      for (std::size_t b = 0; b < position_buckets.size(); ++b)
        if (pos >= position_buckets[b].first && pos < position_buckets[b].end) {
          bucket_loss[b] += l;
          ++bucket_predictions[b];
        }
    }
    ++sequences;
  }

  double loss() const noexcept { return predictions ? loss_sum / double(predictions) : std::nan(""); }
  double confident_share() const noexcept { return predictions ? double(confident) / double(predictions) : std::nan(""); }

  /// The fields of the log.jsonl line ("eval_loss", "eval_loss_by_position" {bucket: mean}, ...);
  /// `answers`: the counted predictions are kv-recall answers (adds "eval_answer_accuracy").
  nlohmann::json to_json(bool answers) const {
    nlohmann::json by = nlohmann::json::object(), count = nlohmann::json::object();
    for (std::size_t b = 0; b < position_buckets.size(); ++b)
      if (bucket_predictions[b] > 0) {
        by[position_buckets[b].name] = bucket_loss[b] / double(bucket_predictions[b]);
        count[position_buckets[b].name] = bucket_predictions[b];
      }
    nlohmann::json j = {{"eval_loss", loss()},           {"eval_predictions", predictions},
                        {"eval_sequences", sequences},   {"eval_loss_by_position", by},
                        {"eval_predictions_by_position", count}, {"eval_seconds", seconds}};
    if (answers) j["eval_answer_accuracy"] = confident_share();
    return j;
  }

  /// "eval | loss 2.3456 | by position 0-4K 2.1 · 4K-32K 2.4 | answer accuracy 87.5% | 12.3 s"
  std::string line(bool answers) const {
    std::string s = fmt::format("eval  | loss {:.4f} over {} predictions in {} sequences", loss(), predictions, sequences);
    std::string by;
    for (std::size_t b = 0; b < position_buckets.size(); ++b)
      if (bucket_predictions[b] > 0)
        by += fmt::format("{}{} {:.4f}", by.empty() ? "" : " · ", position_buckets[b].name,
                          bucket_loss[b] / double(bucket_predictions[b]));
    if (!by.empty()) s += " | by position " + by;
    if (answers) s += fmt::format(" | answer accuracy {:.1f}%", 100.0 * confident_share());
    return s + fmt::format(" | {:.2f} s", seconds);
  }
};

}  // namespace oomb_trainer
