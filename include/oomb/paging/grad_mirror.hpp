// oomb — the gradient mirror: a gradient page pair for each KV page that has received a gradient.
// SPDX-License-Identifier: Apache-2.0
//
// Thread safety: a grad_mirror is NOT internally synchronised. touch, accumulate and release need
// external synchronisation against every other call on the same mirror; const calls may run
// concurrently with each other.
//
// Errors: a throwing call leaves the mirror exactly as it was (strong guarantee).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/memory_kind.hpp"
#include "oomb/core/tensor.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/paging/page_pool_config.hpp"
#include "oomb/paging/page_shape.hpp"
#include "oomb/paging/views.hpp"

OOMB_NAMESPACE_BEGIN

/// What a grad_mirror holds.
struct grad_mirror_config {
  page_shape shape{};          ///< the KV pages' shape (layout included): gradient pages match it
  std::int32_t kv_ids = 0;     ///< size of the KV id space: KV ids are in [0, kv_ids) (the KV
                               ///< pool's capacity)
  page_pool_config pool{};     ///< capacity of the gradient pool, in dK/dV page pairs
  /// Bytes of one element in the pool: 0 = sizeof(G). Fewer when a converting residency tier keeps
  /// the homes in a narrower encoding than the G its slots compute in (bf16 homes of fp32 pages:
  /// 2); the pool then holds no G, and the host accessors that read pages as G refuse.
  std::size_t home_element_bytes = 0;

  void validate() const {
    shape.validate();
    OOMB_EXPECTS(kv_ids > 0, "grad_mirror: kv_ids must be positive, got ", kv_ids);
    pool.validate("grad_mirror");
  }
};

/// Result of grad_mirror::touch: the gradient pair of a KV page, and whether it was acquired by
/// this call (its memory is then uninitialised until someone zeroes it).
struct grad_touch {
  std::int32_t grad_id = -1;
  bool fresh = false;
};

/// Gradient pages that mirror KV pages, per the page model: `grad_id(kv_id)` is -1 until the KV
/// page is first touched, then names a dK/dV page pair in the mirror's own pool, whose element type
/// G is independent of the KV type (fp32 for bf16 KV by default).
///
/// Zeroing on first touch is a customisation point, because where the page is zeroed depends on
/// where it lives:
///  - touch(kv_id) only assigns the page and says whether it is fresh; it never writes memory.
///    On the GPU the residency scheduler does this and zeroes the near-tier slot with a device
///    memset (the host copy of a fresh page is never read).
///  - touch(kv_id, zero_fill) calls `zero_fill(grad_id)` for a fresh page; if that throws, the page
///    goes back to the pool and the mirror is unchanged.
///  - touch_zeroed(kv_id) zero-fills a fresh page on the host (host-accessible pools only), and
///    accumulate() builds on it for host users.
template <class G, class Resource>
class grad_mirror {
  static_assert(std::is_trivially_copyable_v<G>, "gradient elements are zeroed and copied as bytes");

 public:
  using element_type = G;
  using resource_type = Resource;
  using page_view = tensor_view<G, 3>;  ///< [kv_head][token][dim], strides per the layout
  static constexpr std::int32_t untouched = -1;

  grad_mirror(Resource& resource, const grad_mirror_config& config)
      : config_(validated(config)),
        pool_(detail::make_page_pool(resource, pair_bytes_of(config), config.pool)),
        grad_id_(static_cast<std::size_t>(config.kv_ids), untouched) {}

  grad_mirror(const grad_mirror&) = delete;
  grad_mirror& operator=(const grad_mirror&) = delete;
  grad_mirror(grad_mirror&&) noexcept = default;
  grad_mirror& operator=(grad_mirror&&) noexcept = default;

  const grad_mirror_config& config() const noexcept { return config_; }
  const page_shape& shape() const noexcept { return config_.shape; }
  std::int32_t num_kv_ids() const noexcept { return config_.kv_ids; }
  /// KV pages that currently have a gradient page.
  std::int32_t num_touched() const noexcept { return pool_.in_use(); }
  /// Bytes of a dK/dV pair in the pool (its homes' encoding).
  std::size_t pair_bytes() const noexcept { return pair_bytes_of(config_); }
  /// True when the pool holds pages of G (no narrower home encoding).
  bool holds_elements() const noexcept { return element_bytes(config_) == sizeof(G); }

  /// Gradient pair of KV page `kv_id`, or -1 (untouched).
  std::int32_t grad_id(std::int32_t kv_id) const {
    check_kv(kv_id, "grad_id");
    return grad_id_[static_cast<std::size_t>(kv_id)];
  }
  bool touched(std::int32_t kv_id) const { return grad_id(kv_id) != untouched; }

  /// The gradient pair of `kv_id`, acquired on first touch (memory NOT zeroed; see the class
  /// comment). Throws invalid_argument for a KV id out of range, out_of_memory when the pool is
  /// full.
  grad_touch touch(std::int32_t kv_id) {
    return touch(kv_id, [](std::int32_t) {});
  }
  /// As touch(kv_id), calling `zero_fill(grad_id)` when the page is fresh.
  template <class ZeroFill>
  grad_touch touch(std::int32_t kv_id, ZeroFill&& zero_fill) {
    check_kv(kv_id, "touch");
    std::int32_t& g = grad_id_[static_cast<std::size_t>(kv_id)];
    if (g != untouched) return {g, false};
    if (pool_.available() == 0)
      OOMB_FAIL(out_of_memory, "grad_mirror: touch of KV page ", kv_id, " needs a gradient page pair of ",
                pair_bytes(), " bytes; the pool has 0 left of ", pool_.capacity(), " (", pool_.in_use(),
                " in use)");
    const std::int32_t id = pool_.acquire();
    try {
      zero_fill(id);
    } catch (...) {
      pool_.release(id);
      throw;
    }
    g = id;
    return {id, true};
  }
  /// Host: touch(kv_id), zero-filling a fresh page where it lives. Returns the gradient pair id.
  std::int32_t touch_zeroed(std::int32_t kv_id) {
    static_assert(host_accessible(Resource::kind),
                  "grad_mirror::touch_zeroed writes the page on the host: use touch() and a device memset");
    return touch(kv_id, [this](std::int32_t id) {
             std::memset(pool_.address(id), 0, pair_bytes());
           }).grad_id;
  }

  /// Host: adds a dK page and a dV page (each page_elements() values of G in the page layout,
  /// either may be null to skip it) into the gradient pair of `kv_id`, zero-filled on first touch.
  void accumulate(std::int32_t kv_id, const G* dk_page, const G* dv_page) {
    static_assert(host_accessible(Resource::kind), "grad_mirror::accumulate runs on the host");
    check_elements("accumulate");
    const std::int32_t id = touch_zeroed(kv_id);
    G* dst = pair_of(id);
    const std::int64_t n = config_.shape.page_elements();
    if (dk_page != nullptr) add(dst, dk_page, n);
    if (dv_page != nullptr) add(dst + n, dv_page, n);
  }

  /// Returns the gradient pair of `kv_id` to the pool (call it when the KV page is released).
  /// Throws invalid_argument for a KV id out of range or one that was never touched.
  void release(std::int32_t kv_id) {
    check_kv(kv_id, "release");
    std::int32_t& g = grad_id_[static_cast<std::size_t>(kv_id)];
    OOMB_EXPECTS(g != untouched, "grad_mirror: release of KV page ", kv_id,
                 " which has no gradient page (never touched, or released twice)");
    pool_.release(g);
    g = untouched;
  }
  /// As release(), but a no-op returning false for an untouched page: the shape of
  /// `cache.pop_chunk(seq, [&](std::int32_t id) { grads.release_if_touched(id); })`.
  bool release_if_touched(std::int32_t kv_id) {
    check_kv(kv_id, "release_if_touched");
    if (grad_id_[static_cast<std::size_t>(kv_id)] == untouched) return false;
    release(kv_id);
    return true;
  }

  /// Host pointer to head_dim contiguous gradient elements of (kv_id, token in page, kv head).
  G* dk(std::int32_t kv_id, std::int32_t token, std::int32_t head) const {
    return element(kv_id, token, head, 0);
  }
  G* dv(std::int32_t kv_id, std::int32_t token, std::int32_t head) const {
    return element(kv_id, token, head, config_.shape.page_elements());
  }
  /// The dK (dV) page of a touched KV page as a view [kv_head][token][dim].
  page_view dk_page(std::int32_t kv_id) const { return page_of(kv_id, 0); }
  page_view dv_page(std::int32_t kv_id) const { return page_of(kv_id, config_.shape.page_elements()); }

  /// The gradient pool as kernels address it (contiguous pools only; throws otherwise).
  page_pool_view<G> pool_view() const {
    check_elements("pool_view/view");
    OOMB_EXPECTS(pool_.is_contiguous(), "grad_mirror: pool_view()/view() need a contiguous pool ",
                 "(config.pool.mode = pool_mode::contiguous)");
    return page_pool_view<G>::over(reinterpret_cast<G*>(pool_.base()), config_.shape);
  }
  /// Pool plus the id table (host memory owned by the mirror; stays valid while the mirror lives).
  grad_mirror_view<G> view() const {
    grad_mirror_view<G> v;
    v.pool = pool_view();
    v.grad_id = grad_id_.data();
    v.num_kv_ids = config_.kv_ids;
    return v;
  }
  /// The id table, indexed by KV id (-1: untouched).
  const std::vector<std::int32_t>& grad_ids() const noexcept { return grad_id_; }

  const block_pool<Resource>& pool() const noexcept { return pool_; }
  /// The pool itself, for a residency scheduler that moves page contents (and writes dirty pages
  /// back). Acquiring or releasing through it bypasses the id table: don't.
  block_pool<Resource>& pool() noexcept { return pool_; }
  block_pool_stats stats() const noexcept { return pool_.stats(); }

 private:
  static const grad_mirror_config& validated(const grad_mirror_config& c) {
    c.validate();
    OOMB_EXPECTS(c.home_element_bytes <= sizeof(G), "grad_mirror: home elements of ", c.home_element_bytes,
                 " bytes are wider than the ", sizeof(G), "-byte gradient elements they encode");
    return c;
  }
  static std::size_t element_bytes(const grad_mirror_config& c) noexcept {
    return c.home_element_bytes == 0 ? sizeof(G) : c.home_element_bytes;
  }
  static std::size_t pair_bytes_of(const grad_mirror_config& c) noexcept {
    return static_cast<std::size_t>(c.shape.pair_elements()) * element_bytes(c);
  }
  void check_elements(const char* who) const {
    OOMB_EXPECTS(holds_elements(), "grad_mirror::", who, " reads pages as ", sizeof(G), "-byte elements, but the pool's homes hold ",
                 element_bytes(config_), "-byte ones (a converting residency tier's encoding)");
  }
  void check_kv(std::int32_t kv_id, const char* where) const {
    OOMB_EXPECTS(kv_id >= 0 && kv_id < config_.kv_ids, "grad_mirror::", where, ": KV page id ", kv_id,
                 " out of range [0, ", config_.kv_ids, ")");
  }
  // Arithmetic types add directly; others (bf16) through float.
  static void add(G* dst, const G* src, std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_arithmetic_v<G>)
        dst[i] += src[i];
      else
        dst[i] = G(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
    }
  }
  G* pair_of(std::int32_t grad) const { return reinterpret_cast<G*>(pool_.address(grad)); }
  std::int32_t touched_id(std::int32_t kv_id, const char* where) const {
    check_kv(kv_id, where);
    const std::int32_t g = grad_id_[static_cast<std::size_t>(kv_id)];
    OOMB_EXPECTS(g != untouched, "grad_mirror::", where, ": KV page ", kv_id, " has no gradient page");
    return g;
  }
  G* element(std::int32_t kv_id, std::int32_t token, std::int32_t head, std::int64_t kv_offset) const {
    check_elements("dk/dv");
    const std::int32_t g = touched_id(kv_id, "dk/dv");
    const auto& s = config_.shape;
    OOMB_EXPECTS(token >= 0 && token < s.page_size, "grad_mirror: token ", token, " out of range [0, ",
                 s.page_size, ")");
    OOMB_EXPECTS(head >= 0 && head < s.kv_heads, "grad_mirror: kv head ", head, " out of range [0, ",
                 s.kv_heads, ")");
    return pair_of(g) + kv_offset + std::int64_t(token) * s.stride_token() + std::int64_t(head) * s.stride_head();
  }
  page_view page_of(std::int32_t kv_id, std::int64_t kv_offset) const {
    check_elements("dk_page/dv_page");
    const std::int32_t g = touched_id(kv_id, "dk_page/dv_page");
    const auto& s = config_.shape;
    return page_view(pair_of(g) + kv_offset, {s.kv_heads, s.page_size, s.head_dim},
                     {s.stride_head(), s.stride_token(), 1}, Resource::kind);
  }

  grad_mirror_config config_;
  block_pool<Resource> pool_;
  std::vector<std::int32_t> grad_id_;  // indexed by KV id
};

OOMB_NAMESPACE_END
