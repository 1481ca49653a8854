// oomb trainer — JSON helpers shared by the file readers: bounded parsing, brief value text.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "oomb/core/error.hpp"

namespace oomb_trainer::detail {

/// A JSON value in an error message: scalars as written (cut at 80 characters), containers by
/// kind — never dumped whole, since a hostile file may nest them deeply or make them huge.
inline std::string json_brief(const nlohmann::json& v) {
  if (v.is_primitive()) {
    std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
  }
  return std::string("a JSON ") + v.type_name();
}

/// Parses JSON text, refusing nesting deeper than `max_depth` so that nothing after (copies,
/// destruction, printing) recurses deeply. Malformed text is an oomb::format_error naming `origin`.
inline nlohmann::json parse_json_bounded(const char* first, const char* last, int max_depth,
                                         const std::string& origin, const char* what) {
  auto guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    OOMB_CHECK(depth <= max_depth, oomb::format_error, origin, ": ", what, " nests deeper than ",
               max_depth, " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(first, last, guard);
  } catch (const nlohmann::json::exception& e) {
    OOMB_FAIL(oomb::format_error, origin, ": malformed JSON in the ", what, ": ", e.what());
  }
}

}  // namespace oomb_trainer::detail
