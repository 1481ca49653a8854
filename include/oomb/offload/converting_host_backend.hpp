// oomb — the CPU residency backend whose homes hold a narrower encoding than the near slots.
// SPDX-License-Identifier: Apache-2.0
//
// basic_host_backend with a page codec (bf16_codec.hpp): a home of far.block_bytes() holds
// far.block_bytes() / sizeof(far_type) elements, a near slot as many of near_type. The scheduler
// sizes its slots by near_block_bytes() and moves pages through decode_pages (home -> slot) and
// encode_pages (slot -> home), one work item per batch on the given host stream, so a conversion
// is ordered like the copy it replaces. Zero fills stay the base's memset of near slots: zero
// bytes are 0.0 in either encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/offload/host_backend.hpp"
#include "oomb/offload/page_transfer.hpp"

OOMB_NAMESPACE_BEGIN

/// A host residency backend converting pages with `Codec` (near_type <-> far_type) on their way
/// between the tiers; the homes come from `FarResource`.
template <class Codec, class FarResource = host_resource>
class converting_host_backend : public basic_host_backend<FarResource> {
 public:
  using codec_type = Codec;
  using near_type = typename Codec::near_type;
  using far_type = typename Codec::far_type;
  using near_resource = typename basic_host_backend<FarResource>::near_resource;
  using far_resource = FarResource;

  explicit converting_host_backend(Codec codec = Codec{}) : codec_(codec) {}

  /// Bytes of a near slot for homes of `far_block_bytes`: the same elements, near_type wide.
  std::size_t near_block_bytes(std::size_t far_block_bytes) const {
    OOMB_EXPECTS(far_block_bytes > 0 && far_block_bytes % sizeof(far_type) == 0, "converting_host_backend: homes of ",
                 far_block_bytes, " bytes are not whole elements of ", sizeof(far_type), " bytes");
    return far_block_bytes / sizeof(far_type) * sizeof(near_type);
  }

  /// Decodes home far_ids[i] into slot near_ids[i], as one work item on `stream`.
  transfer_report decode_pages(host_stream& stream, block_pool<near_resource>& near, id_span near_ids,
                               const block_pool<FarResource>& far, id_span far_ids) {
    const std::size_t n = elements(near, far, near_ids, far_ids, "decode_pages");
    std::vector<std::pair<const far_type*, near_type*>> pages(near_ids.size());
    for (std::size_t i = 0; i < pages.size(); ++i)
      pages[i] = {reinterpret_cast<const far_type*>(far.address(far_ids[i])),
                  reinterpret_cast<near_type*>(near.address(near_ids[i]))};
    if (!pages.empty())
      stream.enqueue([pages = std::move(pages), n] {
        for (const auto& p : pages) Codec::decode(p.first, p.second, n);
      });
    return {near_ids.size(), near_ids.size(), near_ids.size() * far.block_bytes()};
  }

  /// Encodes slot near_ids[i] into home far_ids[i], as one work item on `stream`. Each page
  /// written gets the next key of this backend (stochastic rounding draws fresh bits per write).
  transfer_report encode_pages(host_stream& stream, block_pool<FarResource>& far, id_span far_ids,
                               const block_pool<near_resource>& near, id_span near_ids) {
    const std::size_t n = elements(near, far, near_ids, far_ids, "encode_pages");
    std::vector<std::pair<const near_type*, far_type*>> pages(near_ids.size());
    for (std::size_t i = 0; i < pages.size(); ++i)
      pages[i] = {reinterpret_cast<const near_type*>(near.address(near_ids[i])),
                  reinterpret_cast<far_type*>(far.address(far_ids[i]))};
    if (!pages.empty())
      stream.enqueue([pages = std::move(pages), n, codec = codec_, key = writes_] {
        for (std::size_t i = 0; i < pages.size(); ++i) codec.encode(pages[i].first, pages[i].second, n, key + i);
      });
    writes_ += near_ids.size();
    return {near_ids.size(), near_ids.size(), near_ids.size() * far.block_bytes()};
  }

  const Codec& codec() const noexcept { return codec_; }
  /// Pages encoded so far: the key the next one gets.
  std::uint64_t pages_written() const noexcept { return writes_; }

 private:
  // Validates a batch (before anything is enqueued) and returns the elements of one page.
  template <class NearPool, class FarPool>
  std::size_t elements(const NearPool& near, const FarPool& far, id_span near_ids, id_span far_ids,
                       const char* who) const {
    OOMB_EXPECTS(near_ids.size() == far_ids.size(), "converting_host_backend::", who, ": ", near_ids.size(),
                 " slot ids but ", far_ids.size(), " home ids");
    OOMB_EXPECTS(near.block_bytes() == near_block_bytes(far.block_bytes()), "converting_host_backend::", who,
                 ": slots of ", near.block_bytes(), " bytes do not hold the homes' pages of ", far.block_bytes(),
                 " bytes (they need ", near_block_bytes(far.block_bytes()), ")");
    for (std::size_t i = 0; i < near_ids.size(); ++i) {
      OOMB_EXPECTS(near.owns(near_ids[i]), "converting_host_backend::", who, ": slot ", near_ids[i], " (entry ", i,
                   ") is not in use");
      OOMB_EXPECTS(far.owns(far_ids[i]), "converting_host_backend::", who, ": home ", far_ids[i], " (entry ", i,
                   ") is not in use in the far pool");
    }
    return far.block_bytes() / sizeof(far_type);
  }

  Codec codec_;
  std::uint64_t writes_ = 0;
};

OOMB_NAMESPACE_END
