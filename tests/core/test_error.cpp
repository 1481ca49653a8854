// Errors and check macros: messages carry the values and file:line; the hierarchy is catchable.
#define OOMB_ENABLE_BOUNDS_CHECKS 1  // every tests/core file that includes oomb checks bounds alike

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "oomb/core/error.hpp"
#include "oomb/core/tensor.hpp"

namespace {

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception of the asked type");
  return {};
}

std::string where(int line) { return std::string(__FILE__) + ":" + std::to_string(line) + "]"; }

int side_effects = 0;
int counted(int v) {
  ++side_effects;
  return v;
}

}  // namespace

TEST_CASE("error classes derive from oomb::error and std::runtime_error") {
  static_assert(std::is_base_of_v<std::runtime_error, oomb::error>);
  static_assert(std::is_base_of_v<oomb::error, oomb::out_of_memory>);
  static_assert(std::is_base_of_v<oomb::error, oomb::invalid_argument>);
  static_assert(std::is_base_of_v<oomb::error, oomb::cuda_error>);
  static_assert(std::is_base_of_v<oomb::error, oomb::format_error>);
  static_assert(!std::is_base_of_v<oomb::invalid_argument, oomb::out_of_memory>);
  static_assert(!std::is_base_of_v<std::invalid_argument, oomb::invalid_argument>);
  CHECK_THROWS_AS(throw oomb::format_error("x"), oomb::error);
  CHECK_THROWS_AS(throw oomb::cuda_error("x"), std::runtime_error);
  CHECK(std::string(oomb::out_of_memory("what").what()) == "what");
}

TEST_CASE("OOMB_EXPECTS streams its parts and names file:line") {
  const int layers = -3;
  const double ratio = 0.25;
  const int line = __LINE__ + 2;
  const auto msg = message_of<oomb::invalid_argument>(
      [&] { OOMB_EXPECTS(layers > 0, "layers must be positive, got ", layers, " (ratio ", ratio, ")"); });
  CHECK(msg == "oomb: layers must be positive, got -3 (ratio 0.25) [" + where(line));
}

TEST_CASE("OOMB_CHECK raises the given type; OOMB_FAIL always raises") {
  const std::size_t asked = 4096, left = 100;
  int line = __LINE__ + 2;
  auto msg = message_of<oomb::out_of_memory>(
      [&] { OOMB_CHECK(asked <= left, oomb::out_of_memory, "asked for ", asked, " bytes, ", left, " left"); });
  CHECK(msg == "oomb: asked for 4096 bytes, 100 left [" + where(line));

  line = __LINE__ + 1;
  msg = message_of<oomb::format_error>([] { OOMB_FAIL(oomb::format_error, "bad header ", 'x', 7); });
  CHECK(msg == "oomb: bad header x7 [" + where(line));

  // A passing check throws nothing and does not evaluate its message parts.
  side_effects = 0;
  CHECK_NOTHROW(OOMB_CHECK(asked > left, oomb::out_of_memory, "never built ", counted(1)));
  CHECK_NOTHROW(OOMB_EXPECTS(true, counted(2)));
  CHECK(side_effects == 0);
  // The condition is evaluated exactly once.
  int evaluated = 0;
  OOMB_EXPECTS(++evaluated == 1, "evaluated twice");
  CHECK(evaluated == 1);
  // A failing check builds its message once.
  side_effects = 0;
  CHECK_THROWS_AS(OOMB_EXPECTS(false, counted(5), counted(6)), oomb::invalid_argument);
  CHECK(side_effects == 2);
}

TEST_CASE("check macros are single statements (safe in unbraced if/else)") {
  int branch = 0;
  const bool flag = false;
  if (flag)
    OOMB_EXPECTS(false, "not taken");
  else
    branch = 2;
  CHECK(branch == 2);
  if (!flag) OOMB_CHECK(true, oomb::out_of_memory, "fine"); else branch = 3;
  CHECK(branch == 2);
}

TEST_CASE("library errors name the header's file and line") {
  float data[4] = {1, 2, 3, 4};
  const auto v = oomb::tensor_view<float, 1>::contiguous(data, {4});
  const auto msg = message_of<oomb::invalid_argument>([&] { (void)v(9); });
  CHECK(msg.find("tensor_view index 9 out of range [0, 4) in dimension 0") != std::string::npos);
  CHECK(msg.find("oomb/core/tensor.hpp:") != std::string::npos);
  CHECK(msg.rfind("oomb: ", 0) == 0);
  CHECK(msg.back() == ']');
}
