// oomb — the residency scheduler on CUDA with homes in a narrower encoding than the device slots:
// bf16 homes in pinned memory, fp32 slots on the device (a converting tier, residency_backend.hpp).
// SPDX-License-Identifier: Apache-2.0
//
// cuda_converting_backend<Codec> is to cuda_backend (residency.cuh) what converting_host_backend
// is to host_backend: the same streams, resources and zero fills, plus near_block_bytes,
// decode_pages and encode_pages, so residency_scheduler keeps homes of Codec::far_type and slots of
// Codec::near_type. A class of its own rather than a codec policy of cuda_backend: a plain
// backend must not have the codec members at all (the scheduler converts when they exist), and
// only a converting one owns staging and conversion kernels.
//
// How a batch converts: the homes cross PCIe in their narrow encoding by the library's page
// transfer (page_transfer.cuh: copy engines, or the gather kernel for many small pages, as
// cuda_backend chooses) between the pinned homes and a device staging range, and the conversion
// runs on the device between staging and the slots (page_codec_kernels.cuh):
//   decode (home -> slot):  transfer homes -> staging[0, n), then decode kernel staging -> slots
//   encode (slot -> home):  encode kernel slots -> staging[0, n), then transfer staging -> homes
// Why not one kernel reading and writing the mapped pinned homes (as the gather kernel does): on
// the H200 the copy engines move 53-55 GB/s per direction and 93-101 GB/s both at once with no SM
// held, while SM-issued PCIe traffic reaches 48-52 GB/s per direction but only 63-72 GB/s both ways,
// and holds its blocks for the whole transfer. A gradient tier prefetches and writes back at once
// (beside the K/V tier's prefetches), so the copy engines' both-ways rate decides; the conversion
// kernels touch device memory only (~6 bytes an element at HBM speed against 2 bytes at PCIe
// speed: a few percent of the copy) and hold SMs for that long only.
// Ordering: every step of a batch is enqueued on the stream the scheduler passes (decode: copy-in,
// encode: copy-out), so a direction's staging is reused in its stream's order, the scheduler's
// events after the call cover the conversion, and the host never waits. Each direction has its own
// staging (the two streams run at once): as many pages as the scheduler has slots (no batch has
// more), so the device holds, beside the slots, staging of as many home bytes again as all slots
// hold in their encoding (bf16 homes of fp32 slots: half the slots' bytes per direction). The
// slot ids a conversion kernel reads reach the device through an upload_ring per direction.
// prepare() (the scheduler's constructor) allocates all of it; a batch allocates nothing.
// Stochastic rounding: page i of the backend's writes (counted from 0 over its life) is encoded
// under key i, as converting_host_backend does, so both give the same homes for one sequence.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/core/id_span.hpp"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/nvtx.hpp"
#include "oomb/cuda/page_codec_kernels.cuh"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/staged_page_transfer.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/stream_view.hpp"
#include "oomb/cuda/upload_ring.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/offload/page_transfer.hpp"
#include "oomb/offload/residency_backend.hpp"

OOMB_NAMESPACE_BEGIN

/// Converting residency backend over CUDA streams: slots of Codec::near_type in `NearResource`
/// (device memory), homes of Codec::far_type in `FarResource` (pinned memory by default, or pageable:
/// then the homes reach the device staging through pinned staging, staged_page_transfer.cuh); `Stream`
/// as cuda_backend's. See the file comment.
template <class Codec, class NearResource = device_resource, class Stream = cuda_stream, class FarResource = pinned_resource>
class cuda_converting_backend {
  static_assert(NearResource::kind == memory_kind::device, "cuda_converting_backend: the near tier is device memory");

 public:
  using codec_type = Codec;
  using near_type = typename Codec::near_type;
  using far_type = typename Codec::far_type;
  using stream_type = Stream;
  using compute_stream_type = cuda_stream_view;
  using near_resource = NearResource;
  using far_resource = FarResource;

  /// The same transfer options for both directions.
  explicit cuda_converting_backend(Codec codec = Codec{}, cuda_transfer_options options = {})
      : cuda_converting_backend(codec, options, options) {}
  /// Options for the homes' transfers to the device (decode) and to the host (encode).
  cuda_converting_backend(Codec codec, cuda_transfer_options to_near, cuda_transfer_options to_far)
      : codec_(codec), in_options_(to_near), out_options_(to_far) {}

  /// Bytes of a near slot for homes of `far_block_bytes`: the same elements, near_type wide.
  std::size_t near_block_bytes(std::size_t far_block_bytes) const {
    OOMB_EXPECTS(far_block_bytes > 0 && far_block_bytes % sizeof(far_type) == 0, "cuda_converting_backend: homes of ",
                 far_block_bytes, " bytes are not whole elements of ", sizeof(far_type), " bytes");
    return far_block_bytes / sizeof(far_type) * sizeof(near_type);
  }

  /// cudaMemsetAsync of `bytes` zero bytes at `dst` on `stream` (zero bytes are zeros in either
  /// encoding).
  void zero_fill(stream_type& stream, void* dst, std::size_t bytes) const {
    cuda_stream_view(stream).enqueue_memset(dst, 0, bytes);
  }

  /// Allocates each direction's staging (a page per slot of `near`, homes' bytes each, from
  /// near's resource), its transfer and its id ring; called once by the scheduler's constructor.
  void prepare(block_pool<near_resource>& near, block_pool<far_resource>& far) {
    OOMB_EXPECTS(near.is_contiguous(), "cuda_converting_backend: the slots must be one contiguous pool");
    OOMB_EXPECTS(near.block_bytes() == near_block_bytes(far.block_bytes()), "cuda_converting_backend: slots of ",
                 near.block_bytes(), " bytes do not hold the homes' pages of ", far.block_bytes(), " bytes (they need ",
                 near_block_bytes(far.block_bytes()), ")");
    const std::int32_t n = near.capacity();
    auto in = std::make_unique<state<in_transfer>>(near.resource(), far.block_bytes(), n);
    in->transfer = std::make_unique<in_transfer>(in->staging, static_cast<const block_pool<far_resource>&>(far), in_options_);
    auto out = std::make_unique<state<out_transfer>>(near.resource(), far.block_bytes(), n);
    out->transfer = std::make_unique<out_transfer>(far, out->staging, out_options_);
    in_ = std::move(in);
    out_ = std::move(out);
    far_ = &far;
    staging_ids_.resize(static_cast<std::size_t>(n));
    std::iota(staging_ids_.begin(), staging_ids_.end(), 0);
    sorted_.reserve(static_cast<std::size_t>(n));
  }

  /// NVTX ranges (in the "oomb" domain) around the scheduler's batches.
  void range_begin(const char* name) noexcept { detail::nvtx_push(name); }
  void range_end() noexcept { detail::nvtx_pop(); }

  /// Decodes home far_ids[i] into slot near_ids[i], on `stream`: the homes to staging, then the
  /// decode kernel. Everything is validated before anything is enqueued.
  transfer_report decode_pages(stream_type& stream, block_pool<near_resource>& near, id_span near_ids,
                               const block_pool<far_resource>& far, id_span far_ids) {
    const std::size_t elements = validate(near, far, near_ids, far_ids, near_ids, "decode_pages");
    if (near_ids.empty()) return {};
    const cuda_stream_view s(stream);
    const std::size_t n = near_ids.size();
    const cuda_transfer_report r = in_->transfer->enqueue(s, staging_span(n), far_ids);
    const auto ids = in_->ids.upload(near_ids.data(), n, s);
    launch_decode_pages<Codec>(reinterpret_cast<const far_type*>(in_->staging.base()),
                               reinterpret_cast<near_type*>(near.base()), ids.data, n, elements, s.get());
    in_->ids.release(ids, s);
    return r;
  }

  /// Encodes slot near_ids[i] into home far_ids[i], on `stream`: the encode kernel, then staging
  /// to the homes. Page i of the batch is written under key pages_written() + i.
  transfer_report encode_pages(stream_type& stream, block_pool<far_resource>& far, id_span far_ids,
                               const block_pool<near_resource>& near, id_span near_ids) {
    const std::size_t elements = validate(near, far, near_ids, far_ids, far_ids, "encode_pages");
    if (near_ids.empty()) return {};
    const cuda_stream_view s(stream);
    const std::size_t n = near_ids.size();
    const auto ids = out_->ids.upload(near_ids.data(), n, s);
    launch_encode_pages(codec_, reinterpret_cast<const near_type*>(near.base()), ids.data,
                        reinterpret_cast<far_type*>(out_->staging.base()), n, elements, writes_, s.get());
    out_->ids.release(ids, s);
    const cuda_transfer_report r = out_->transfer->enqueue(s, far_ids, staging_span(n));
    writes_ += n;
    return r;
  }

  const Codec& codec() const noexcept { return codec_; }
  /// Pages encoded so far: the key the next one gets.
  std::uint64_t pages_written() const noexcept { return writes_; }
  /// Device bytes of both directions' staging (0 before prepare()).
  std::size_t staging_bytes() const noexcept {
    return in_ ? in_->staging.stats().reserved_bytes + out_->staging.stats().reserved_bytes : 0;
  }

 private:
  using in_transfer = cuda_tier_transfer<near_resource, far_resource>;   // homes -> staging
  using out_transfer = cuda_tier_transfer<far_resource, near_resource>;  // staging -> homes
  // Tables of up to this many batches in flight per direction before the id ring would grow.
  static constexpr std::size_t batches_in_flight = 16;

  // One direction: staging pages 0..n-1 (all acquired, so the transfers may address them), the
  // transfer between staging and the homes, and the ring the kernels' slot ids go through. Behind
  // a pointer: the transfer refers to the staging pool, and the scheduler (hence this) may move.
  template <class Transfer>
  struct state {
    state(near_resource& memory, std::size_t home_bytes, std::int32_t pages)
        : staging(block_pool<near_resource>::contiguous(memory, home_bytes, pages)),
          ids(batches_in_flight *
              ((std::size_t(pages) * sizeof(std::int32_t) + upload_ring::region_alignment - 1) /
               upload_ring::region_alignment * upload_ring::region_alignment)) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(pages));
      staging.acquire(pages, all.data());  // a fresh pool hands out 0, 1, 2, ...
    }
    block_pool<near_resource> staging;
    std::unique_ptr<Transfer> transfer;
    upload_ring ids;
  };

  id_span staging_span(std::size_t n) const noexcept { return id_span(staging_ids_.data(), n); }

  // Validates a batch in full (before anything is enqueued) and returns the elements of one page;
  // `written`: the ids the batch writes (slots or homes), none twice.
  std::size_t validate(const block_pool<near_resource>& near, const block_pool<far_resource>& far, id_span near_ids,
                       id_span far_ids, id_span written, const char* who) {
    OOMB_EXPECTS(in_ != nullptr, "cuda_converting_backend::", who, ": prepare() was not called (a residency_scheduler ",
                 "calls it when it is built)");
    OOMB_EXPECTS(&far == far_, "cuda_converting_backend::", who, ": the far pool is not the one prepare() was given");
    OOMB_EXPECTS(near.block_bytes() == near_block_bytes(far.block_bytes()) && near.is_contiguous(),
                 "cuda_converting_backend::", who, ": slots of ", near.block_bytes(), " bytes do not hold the homes' pages of ",
                 far.block_bytes(), " bytes (they need ", near_block_bytes(far.block_bytes()), ", in one contiguous pool)");
    OOMB_EXPECTS(near_ids.size() == far_ids.size(), "cuda_converting_backend::", who, ": ", near_ids.size(),
                 " slot ids but ", far_ids.size(), " home ids");
    OOMB_EXPECTS(near_ids.size() <= staging_ids_.size(), "cuda_converting_backend::", who, ": a batch of ",
                 near_ids.size(), " pages is more than the ", staging_ids_.size(), " slots it was prepared for");
    for (std::size_t i = 0; i < near_ids.size(); ++i) {
      OOMB_EXPECTS(near.owns(near_ids[i]), "cuda_converting_backend::", who, ": slot ", near_ids[i], " (entry ", i,
                   ") is not in use");
      OOMB_EXPECTS(far.owns(far_ids[i]), "cuda_converting_backend::", who, ": home ", far_ids[i], " (entry ", i,
                   ") is not in use in the far pool");
    }
    sorted_.assign(written.begin(), written.end());
    std::sort(sorted_.begin(), sorted_.end());
    const auto twice = std::adjacent_find(sorted_.begin(), sorted_.end());
    OOMB_EXPECTS(twice == sorted_.end(), "cuda_converting_backend::", who, ": destination ", *twice,
                 " appears twice in one batch");
    return far.block_bytes() / sizeof(far_type);
  }

  Codec codec_;
  cuda_transfer_options in_options_, out_options_;
  std::unique_ptr<state<in_transfer>> in_;
  std::unique_ptr<state<out_transfer>> out_;
  const block_pool<far_resource>* far_ = nullptr;  // the pool prepare() bound the transfers to
  std::vector<std::int32_t> staging_ids_;          // 0, 1, ..., slots - 1
  std::vector<std::int32_t> sorted_;               // validate()'s scratch (reserved by prepare)
  std::uint64_t writes_ = 0;
};

OOMB_NAMESPACE_END
