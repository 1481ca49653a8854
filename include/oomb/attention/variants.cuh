// oomb — every attention kernel that is compiled, listed in one place.
// SPDX-License-Identifier: Apache-2.0
//
// GQA group size, page size, layout (head- or token-major), dense or sparse and the window are
// run-time values of the same kernels, so the instances are only:
//   forward   head_dim 64, 128  x  output element oomb::bf16, float
//   backward  head_dim 64, 128
//   delta     output element oomb::bf16, float;  merge (float)
//   forward, Hopper (forward_sm90.cuh, sm_90a; page_size >= 128)  head_dim 64, 128  x  bf16, float
//   backward, Hopper (backward_sm90.cuh, sm_90a; page_size >= 128)  head_dim 64, 128  x  Q/dO by
//       TMA, wide groups (cp.async), unaligned dq; each takes dense and page-sparse calls
// The configurations that lost to these are not compiled; docs/history/attention.md has their numbers.
// Adding a head size means one line in each table below and its kernel_config entries (plan.hpp).
#pragma once

#include <type_traits>

#include "oomb/core/error.hpp"

#include "oomb/attention/plan.hpp"

#include "oomb/attention/backward.cuh"
#include "oomb/attention/forward.cuh"
#include "oomb/attention/backward_sm90.cuh"
#include "oomb/attention/forward_sm90.cuh"

OOMB_NAMESPACE_BEGIN
namespace attention {

/// Tile shapes per head size.
template <int D>
struct forward_config;
//                                                             D  BM   BN  warps  blocks/SM
template <> struct forward_config<64> { using type = detail::forward_tile<64, 128, 128, 4, 2>; };
template <> struct forward_config<128> { using type = detail::forward_tile<128, 128, 64, 4, 2>; };

/// Hopper forward (TMA + wgmma, warp-specialised): pipeline stages per head size.
template <int D>
struct forward_sm90_config;
// Measured (docs/history/attention.md, Hopper h2): ping-pong consumers +20% at d64 (softmax-bound),
// within noise at d128.                                                D  stages ping-pong
template <> struct forward_sm90_config<64> { using type = detail::forward_sm90_tile<64, 3, true>; };
template <> struct forward_sm90_config<128> { using type = detail::forward_sm90_tile<128, 2, false>; };

template <int D>
struct backward_config;
//                                                                D  keys rows warps blocks/SM  warps: S rows, dKV keys, dQ rows
template <> struct backward_config<64> { using type = detail::backward_tile<64, 128, 128, 8, 1, 4, 4, 4>; };
template <> struct backward_config<128> { using type = detail::backward_tile<128, 128, 64, 8, 1, 2, 4, 2>; };

/// Hopper backward (wgmma, warp-specialised; backward_sm90.cuh): Q/dO pipeline stages, the way dQ
/// reaches global memory and the query rows per step, per head size and kind of call (the public
/// entry's choice: choose_backward_sm90 in attention.cuh). Measured on the H200
/// (docs/history/attention.md, hb3-hb7): the dQ writer warp +16-27% at d64 and 0-5% at d128 over
/// red.add; d64 steps of 128 rows another +6-7%; d128 steps of 80 rows +12-18% over 64; Q/dO as
/// TMA boxes of whole queries (hb6) -6..+18% at d128 and +2..+15% at d64 over cp.async; d64 dQ over
/// all keys added by TMA tensor reductions (hb7) +13-14% over hb6's own-keys bulk reductions (the
/// tensor reductions cost d128 2-11%, so d128 keeps the bulk ones).
/// Every configuration takes dense and page-sparse calls: the query walk cuts steps from the start
/// of each run of tiles that attend the keys and clips them at its end (hs1).
/// `type`: calls whose GQA group fits a step (group <= BM): Q/dO by TMA, steps of
/// floor(BM / group) * group rows. `wide_group`: calls with a wider group (cp.async, packed rows
/// straddle queries). `unaligned`: a dq that is 8- but not 16-byte aligned (the writer's bulk
/// reductions need 16): red.add from the consumers, 64-row steps (hb2).
template <int D>
struct backward_sm90_config;
//                                                                D  stages dQ                            own keys rows TMA Q
template <> struct backward_sm90_config<64> {
  using type = detail::backward_sm90_tile<64, 2, detail::backward_dq::writer_tensor, false, 128, true>;
  using wide_group = detail::backward_sm90_tile<64, 2, detail::backward_dq::writer_warp, true, 128>;
  using unaligned = detail::backward_sm90_tile<64, 3, detail::backward_dq::atomics, true>;
};
template <> struct backward_sm90_config<128> {
  using type = detail::backward_sm90_tile<128, 2, detail::backward_dq::writer_warp, false, 80, true>;
  using wide_group = detail::backward_sm90_tile<128, 2, detail::backward_dq::writer_warp, false, 80>;
  using unaligned = detail::backward_sm90_tile<128, 3>;
};

namespace detail {

/// The tile type of each kernel_config (plan.hpp), and back.
template <kernel_config C>
struct config_type;
template <> struct config_type<kernel_config::forward_portable_d64> { using type = forward_config<64>::type; };
template <> struct config_type<kernel_config::forward_portable_d128> { using type = forward_config<128>::type; };
template <> struct config_type<kernel_config::forward_hopper_d64> { using type = forward_sm90_config<64>::type; };
template <> struct config_type<kernel_config::forward_hopper_d128> { using type = forward_sm90_config<128>::type; };
template <> struct config_type<kernel_config::backward_portable_d64> { using type = backward_config<64>::type; };
template <> struct config_type<kernel_config::backward_portable_d128> { using type = backward_config<128>::type; };
template <> struct config_type<kernel_config::backward_hopper_d64> { using type = backward_sm90_config<64>::type; };
template <> struct config_type<kernel_config::backward_hopper_d64_wide_group> { using type = backward_sm90_config<64>::wide_group; };
template <> struct config_type<kernel_config::backward_hopper_d64_unaligned> { using type = backward_sm90_config<64>::unaligned; };
template <> struct config_type<kernel_config::backward_hopper_d128> { using type = backward_sm90_config<128>::type; };
template <> struct config_type<kernel_config::backward_hopper_d128_wide_group> { using type = backward_sm90_config<128>::wide_group; };
template <> struct config_type<kernel_config::backward_hopper_d128_unaligned> { using type = backward_sm90_config<128>::unaligned; };

template <class Cfg, int I = 0>
constexpr kernel_config config_of() {
  if constexpr (I == kernel_config_count) {
    static_assert(I < kernel_config_count, "not a compiled configuration (variants.cuh)");
    return kernel_config::count;
  } else if constexpr (std::is_same_v<Cfg, typename config_type<static_cast<kernel_config>(I)>::type>) {
    return static_cast<kernel_config>(I);
  } else {
    return config_of<Cfg, I + 1>();
  }
}

/// Each tile type has the shape plan.hpp plans with (so the plan cannot drift from the kernels).
template <int I = 0>
constexpr bool shapes_agree() {
  if constexpr (I == kernel_config_count) {
    return true;
  } else {
    constexpr auto c = static_cast<kernel_config>(I);
    using T = typename config_type<c>::type;
    constexpr tile_shape t = shape_of(c);
    constexpr bool whole = [] {
      if constexpr (!is_forward(c) && shape_of(c).hopper) return T::TMA_Q; else return false;
    }();
    static_assert(T::BM == t.bm && T::BN == t.bn && T::D == t.d && whole == t.whole_queries,
                  "plan.hpp's shape_of disagrees with the tile type");
    static_assert(config_of<T>() == c, "two configurations share a tile type");
    return shapes_agree<I + 1>();
  }
}
static_assert(shapes_agree());

/// Calls f(Cfg{}) with the tile type of configuration c; throws for kernel_config::count.
template <class F>
void with_config(kernel_config c, F&& f) {
  switch (c) {
#define OOMB_ATTENTION_CASE(name) \
  case kernel_config::name: f(typename config_type<kernel_config::name>::type{}); return;
    OOMB_ATTENTION_CASE(forward_portable_d64)
    OOMB_ATTENTION_CASE(forward_portable_d128)
    OOMB_ATTENTION_CASE(forward_hopper_d64)
    OOMB_ATTENTION_CASE(forward_hopper_d128)
    OOMB_ATTENTION_CASE(backward_portable_d64)
    OOMB_ATTENTION_CASE(backward_portable_d128)
    OOMB_ATTENTION_CASE(backward_hopper_d64)
    OOMB_ATTENTION_CASE(backward_hopper_d64_wide_group)
    OOMB_ATTENTION_CASE(backward_hopper_d64_unaligned)
    OOMB_ATTENTION_CASE(backward_hopper_d128)
    OOMB_ATTENTION_CASE(backward_hopper_d128_wide_group)
    OOMB_ATTENTION_CASE(backward_hopper_d128_unaligned)
#undef OOMB_ATTENTION_CASE
    default: OOMB_FAIL(invalid_argument, "attention: no kernel configuration ", static_cast<int>(c));
  }
}

}  // namespace detail

}  // namespace attention
OOMB_NAMESPACE_END
