// The converting residency tier on CUDA (cuda_converting_backend): fp32 (or double) device slots
// over bf16 pinned homes. The conversion kernels against the CPU codec bit for bit on fresh random
// inputs (nearest even and stochastic; every exponent, ties, subnormals, NaN and infinities), and
// the scheduler over it against the CPU's converting_host_backend driven with the same sequence:
// homes, slots and counters equal bit for bit. Tolerance: none, the GPU runs the CPU's functions.
// Every home is compared, also those no tier has written yet: both start with the same bits.
// A run of homes across two pinned allocations that touch moves as one copy per allocation.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/converting_residency.cuh"
#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/page_codec_kernels.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/offload/bf16_codec.hpp"
#include "oomb/offload/converting_host_backend.hpp"
#include "offload/bf16_test_values.hpp"
#include "offload/scheduler_fixture.hpp"

using namespace oomb_cuda_test;
using oomb::access;
using oomb::bf16;
using oomb::bf16_rounding;
using oomb_test::random_values;

namespace {

template <class Near>
using gpu_homes = oomb::cuda_converting_backend<oomb::bf16_codec<Near>>;
using cpu_homes = oomb::converting_host_backend<oomb::bf16_codec<float>>;

static_assert(oomb::is_residency_backend_v<gpu_homes<float>>);
static_assert(oomb::detail::has_backend_codec<gpu_homes<float>>::value);
static_assert(oomb::detail::has_backend_prepare<gpu_homes<double>>::value);

template <class T>
std::vector<T> to_host(const T* device, std::size_t n) {
  std::vector<T> h(n);
  OOMB_CUDA_CHECK(cudaMemcpy(h.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), "test: to host");
  return h;
}
template <class T>
void to_device(T* device, const std::vector<T>& h) {
  OOMB_CUDA_CHECK(cudaMemcpy(device, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "test: to device");
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// The kernels on `pages` pages in scattered slots of `slots` against the codec's host loops.
template <class Near>
void check_kernels(oomb::bf16_codec<Near> codec, std::size_t elements, std::uint32_t seed) {
  const std::size_t slots = 9, pages = 5;
  const std::vector<std::int32_t> slot_ids{7, 0, 4, 8, 2};  // scattered, out of order
  const auto values = random_values<Near>(slots * elements, seed);
  device_buffer<Near> near(slots * elements);
  device_buffer<bf16> staged(pages * elements);
  device_buffer<std::int32_t> ids(pages);
  to_device(near.ptr, values);
  to_device(ids.ptr, slot_ids);
  oomb::cuda_stream stream;

  const std::uint64_t first_key = 1000 + seed;
  oomb::launch_encode_pages(codec, near.ptr, ids.ptr, staged.ptr, pages, elements, first_key, stream.get());
  stream.synchronize();
  const auto got = to_host(staged.ptr, pages * elements);
  std::vector<bf16> want(elements);
  for (std::size_t k = 0; k < pages; ++k) {
    codec.encode(&values[std::size_t(slot_ids[k]) * elements], want.data(), elements, first_key + k);
    for (std::size_t i = 0; i < elements; ++i) REQUIRE(got[k * elements + i].bits == want[i].bits);
  }

  // Decode fresh random bf16 (every bit pattern) into the slots: exact widening, other slots untouched.
  std::mt19937 rng(seed + 1);
  std::vector<bf16> homes(pages * elements);
  for (bf16& h : homes) h = bf16::from_bits(static_cast<std::uint16_t>(rng()));
  to_device(staged.ptr, homes);
  oomb::launch_decode_pages<oomb::bf16_codec<Near>>(staged.ptr, near.ptr, ids.ptr, pages, elements, stream.get());
  stream.synchronize();
  const auto slots_now = to_host(near.ptr, slots * elements);
  std::vector<bool> decoded(slots, false);
  for (std::size_t k = 0; k < pages; ++k) {
    decoded[std::size_t(slot_ids[k])] = true;
    for (std::size_t i = 0; i < elements; ++i) {
      const Near w = oomb::bf16_codec<Near>::decode_element(homes[k * elements + i]);
      const Near g = slots_now[std::size_t(slot_ids[k]) * elements + i];
      if (std::is_same_v<Near, float> || !std::isnan(w)) REQUIRE(same_bits(g, w));
      else REQUIRE(std::isnan(g));
    }
  }
  for (std::size_t s = 0; s < slots; ++s)
    if (!decoded[s])
      for (std::size_t i = 0; i < elements; ++i) REQUIRE(same_bits(slots_now[s * elements + i], values[s * elements + i]));
}

// One GPU tier and one CPU tier over the same pages, driven by the same calls.
struct twin_tiers {
  twin_tiers(std::int32_t pages, std::int32_t slots, std::size_t home_bytes, oomb::bf16_codec<float> codec)
      : far(oomb::block_pool<oomb::pinned_resource>::growing(pinned, home_bytes, 4)),
        copy_in(oomb::cuda_stream::greatest_priority()),
        copy_out(oomb::cuda_stream::greatest_priority()),
        gpu(far, device, slots, copy_in, copy_out, gpu_homes<float>(codec)),
        cpu(pages, slots, home_bytes, cpu_homes(codec)) {
    ids.resize(static_cast<std::size_t>(pages));
    far.acquire(pages, ids.data());
    REQUIRE(ids == cpu.ids);
    // Fresh pinned and heap memory hold different leftovers; a home nobody wrote must compare
    // equal too (a tier must neither read nor write it), so both start with the same bits.
    std::mt19937 rng(static_cast<std::uint32_t>(pages));
    for (std::int32_t p : ids)
      for (std::size_t i = 0; i < elements(); ++i)
        gpu_home(p)[i] = cpu_home(p)[i] = bf16::from_bits(static_cast<std::uint16_t>(rng()));
  }
  std::size_t elements() const { return far.block_bytes() / sizeof(bf16); }
  bf16* gpu_home(std::int32_t p) const { return reinterpret_cast<bf16*>(far.address(p)); }
  bf16* cpu_home(std::int32_t p) const { return reinterpret_cast<bf16*>(cpu.home(p)); }

  // acquire on both; the slots' values checked equal, `delta` added on each (the GPU's through a
  // host round trip on the compute stream), then released.
  void accumulate(const std::vector<std::int32_t>& pages, const std::vector<float>& delta) {
    gpu.prefetch(pages);
    cpu.sched.prefetch(pages);
    const auto gw = gpu.acquire(compute.view(), pages, access::write);
    const auto cw = cpu.sched.acquire(cpu.compute, pages, access::write);
    cpu.compute.synchronize();
    const std::size_t n = elements();
    std::vector<float> slot(n);
    for (std::size_t k = 0; k < pages.size(); ++k) {
      auto* g = reinterpret_cast<float*>(gpu.near_pool().address(gw[k]));
      auto* c = reinterpret_cast<float*>(cpu.slot(cw[k]));
      OOMB_CUDA_CHECK(cudaMemcpyAsync(slot.data(), g, n * 4, cudaMemcpyDeviceToHost, compute.get()), "test: slot down");
      compute.synchronize();
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(same_bits(slot[i], c[i]));
        slot[i] += delta[k * n + i];
        c[i] += delta[k * n + i];
      }
      OOMB_CUDA_CHECK(cudaMemcpyAsync(g, slot.data(), n * 4, cudaMemcpyHostToDevice, compute.get()), "test: slot up");
      compute.synchronize();  // `slot` is reused for the next page
    }
    gpu.release(compute.view(), pages);
    cpu.sched.release(cpu.compute, pages);
  }
  void settle() {
    compute.synchronize();
    gpu.drain();
    cpu.settle();
  }
  void require_same_homes() const {
    for (std::int32_t p : ids) {
      REQUIRE(gpu.home_written(p) == cpu.sched.home_written(p));
      for (std::size_t i = 0; i < elements(); ++i) REQUIRE(gpu_home(p)[i].bits == cpu_home(p)[i].bits);
    }
  }

  oomb::pinned_resource pinned;
  oomb::device_resource device;
  oomb::block_pool<oomb::pinned_resource> far;
  oomb::cuda_stream copy_in, copy_out, compute;
  oomb::residency_scheduler<gpu_homes<float>> gpu;
  oomb_test::tiers<oomb_test::fast_streams, cpu_homes> cpu;
  std::vector<std::int32_t> ids;
};

// Returns the homes at the end.
std::vector<std::uint16_t> run_twins(bf16_rounding rounding) {
  oomb::bf16_codec<float> codec;
  codec.rounding = rounding;
  codec.seed = 77;
  const std::int32_t pages = 11, slots = 4;  // cycles over 11 pages through 4 slots evict every time
  const std::size_t home_bytes = 4096, n = home_bytes / 2;
  twin_tiers t(pages, slots, home_bytes, codec);
  CHECK(t.gpu.page_bytes() == 2 * home_bytes);
  CHECK(t.gpu.backend().staging_bytes() == 2 * std::size_t(slots) * home_bytes);

  // Homes 0-5 hold random bf16 (written on the host); 6-10 are gradient pages, zero at first touch.
  const auto x = random_values<float>(6 * n, 5);
  for (std::int32_t p = 0; p < 6; ++p)
    for (std::size_t i = 0; i < n; ++i) t.gpu_home(p)[i] = t.cpu_home(p)[i] = bf16(x[p * n + i]);
  const std::vector<std::int32_t> written{0, 1, 2, 3, 4, 5};
  t.gpu.mark_written(written);
  t.cpu.sched.mark_written(written);

  // Bring near, accumulate, write back, bring near again: batches of 1-4 pages in random orders.
  std::mt19937 rng(9);
  std::normal_distribution<float> gauss(0.f, 1.f);
  for (int round = 0; round < 12; ++round) {
    std::vector<std::int32_t> batch(t.ids);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(1 + rng() % slots);
    std::vector<float> delta(batch.size() * n);
    for (float& d : delta) d = gauss(rng) * (round % 3 == 0 ? 1e-3f : 1.f);  // small: rounding shows
    t.accumulate(batch, delta);
    if (round % 4 == 3) {
      CHECK(t.gpu.write_back(batch) == t.cpu.sched.write_back(batch));
      t.settle();
      t.require_same_homes();
    }
  }
  t.gpu.flush();
  t.cpu.sched.flush();
  t.settle();
  t.require_same_homes();
  const auto g = t.gpu.stats(), c = t.cpu.sched.stats();
  CHECK(g.write_backs == c.write_backs);
  CHECK(g.write_backs > std::uint64_t(pages));  // pages went home and came back
  CHECK(g.zero_fills == c.zero_fills);
  CHECK(g.zero_fills == 5);
  CHECK(g.evictions == c.evictions);
  CHECK(g.bytes_to_far == c.bytes_to_far);  // the homes' bytes
  CHECK(g.bytes_to_near == c.bytes_to_near);
  CHECK(g.bytes_to_far == g.write_backs * home_bytes);
  CHECK(t.gpu.backend().pages_written() == t.cpu.sched.backend().pages_written());
  std::vector<std::uint16_t> homes;
  for (std::int32_t p : t.ids)
    for (std::size_t i = 0; i < n; ++i) homes.push_back(t.gpu_home(p)[i].bits);
  return homes;
}

// Pinned slabs that touch: one page-aligned host buffer handed out back to back, each slab pinned
// by its own cudaHostRegister, so two slabs are two allocations with neighbouring addresses (as
// small cudaHostAlloc blocks may be).
class touching_pinned_resource {
 public:
  static constexpr oomb::memory_kind kind = oomb::memory_kind::pinned;
  static constexpr std::size_t page = 4096;
  explicit touching_pinned_resource(std::size_t bytes)
      : buffer_(static_cast<std::byte*>(std::aligned_alloc(page, bytes))), capacity_(bytes) {
    REQUIRE(buffer_ != nullptr);
  }
  ~touching_pinned_resource() { std::free(buffer_); }
  touching_pinned_resource(const touching_pinned_resource&) = delete;
  touching_pinned_resource& operator=(const touching_pinned_resource&) = delete;

  void* allocate(std::size_t bytes, std::size_t alignment) {
    REQUIRE((bytes % page == 0 && page % alignment == 0 && used_ + bytes <= capacity_));
    void* p = buffer_ + used_;
    used_ += bytes;
    OOMB_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "test: pinning a slab");
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept { (void)cudaHostUnregister(p); }

 private:
  std::byte* buffer_;
  std::size_t capacity_, used_ = 0;
};
static_assert(oomb::is_memory_resource_v<touching_pinned_resource>);

// What the driver does with one copy of `bytes` from `host` to the device, a range over two pinned
// allocations that touch (reported, not asserted: the library never issues such a copy).
std::string copy_result(const void* host, std::size_t bytes) {
  device_buffer<std::byte> dev(bytes);
  const cudaError_t e = cudaMemcpy(dev.ptr, host, bytes, cudaMemcpyDefault);
  (void)cudaGetLastError();
  return cudaGetErrorName(e);
}

// Whether 64 KiB cudaHostAlloc blocks (the bf16 gradient homes' slabs in the trainer's test) come
// back to back, and what a copy over two that do meets.
std::string touching_host_allocs() {
  constexpr std::size_t bytes = 64 << 10;
  oomb::pinned_resource pinned;
  std::vector<std::byte*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(static_cast<std::byte*>(pinned.allocate(bytes)));
  std::string found = "none of 16 touch";
  for (std::byte* a : blocks)
    if (std::find(blocks.begin(), blocks.end(), a + bytes) != blocks.end()) {
      found = "two touch; one copy over both: " + copy_result(a, 2 * bytes);
      break;
    }
  for (std::byte* b : blocks) pinned.deallocate(b, bytes);
  return found;
}

}  // namespace

TEST_CASE("cuda page codec kernels: encode equals the CPU codec bit for bit, decode widens exactly (float slots)") {
  oomb::bf16_codec<float> c;
  check_kernels(c, 3000, 1);  // not a multiple of a block's elements: partial blocks
  c.rounding = bf16_rounding::stochastic;
  c.seed = 12345;
  check_kernels(c, 3000, 2);
  check_kernels(c, 40000, 3);  // a page of 80 KB of bf16
}

TEST_CASE("cuda page codec kernels: double slots round through float as the CPU does, bit for bit") {
  oomb::bf16_codec<double> c;
  check_kernels(c, 1024, 4);
  c.rounding = bf16_rounding::stochastic;
  c.seed = 6;
  check_kernels(c, 1024, 5);
}

TEST_CASE("cuda converting tier: nearest even, the scheduler end to end equals converting_host_backend bit for bit") {
  (void)run_twins(bf16_rounding::nearest_even);
}

TEST_CASE("cuda converting tier: stochastic rounding, the scheduler end to end equals converting_host_backend bit for bit") {
  // The same sequence rounded another way gives other homes (the mode reaches the kernel).
  CHECK(run_twins(bf16_rounding::stochastic) != run_twins(bf16_rounding::nearest_even));
}

TEST_CASE("cuda converting tier: bad input is refused before anything is enqueued") {
  oomb::pinned_resource pinned;
  oomb::device_resource device;
  oomb::cuda_stream in, out;
  {  // homes that are not whole bf16 elements
    auto far = oomb::block_pool<oomb::pinned_resource>::contiguous(pinned, 63, 4);
    CHECK_THROWS_AS(oomb::residency_scheduler<gpu_homes<float>>(far, device, 2, in, out), oomb::invalid_argument);
  }
  auto far = oomb::block_pool<oomb::pinned_resource>::contiguous(pinned, 256, 4);
  std::vector<std::int32_t> homes(4);
  far.acquire(4, homes.data());
  oomb::residency_scheduler<gpu_homes<float>> sched(far, device, 2, in, out);
  auto& b = sched.backend();
  auto near = oomb::block_pool<oomb::device_resource>::contiguous(device, 512, 3);
  std::vector<std::int32_t> slots(3);
  near.acquire(3, slots.data());
  const std::vector<std::int32_t> two_slots{0, 1}, one_home{0}, two_homes{0, 1}, same_slot{1, 1}, same_home{2, 2},
      free_home{0, 3}, big_slots{0, 1, 2}, big_homes{0, 1, 2};
  far.release(3);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, near, two_slots, far, one_home), doctest::Contains("2 slot ids but 1 home ids"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, near, same_slot, far, two_homes), doctest::Contains("destination 1 appears twice"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(b.encode_pages(out, far, same_home, near, two_slots), doctest::Contains("destination 2 appears twice"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, near, two_slots, far, free_home), doctest::Contains("home 3 (entry 1) is not in use"),
                       oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, near, big_slots, far, big_homes), doctest::Contains("more than the 2 slots"),
                       oomb::invalid_argument);
  auto other = oomb::block_pool<oomb::pinned_resource>::contiguous(pinned, 256, 4);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, near, two_slots, other, two_homes), doctest::Contains("not the one prepare()"),
                       oomb::invalid_argument);
  auto wrong = oomb::block_pool<oomb::device_resource>::contiguous(device, 256, 2);
  CHECK_THROWS_WITH_AS(b.decode_pages(in, wrong, two_slots, far, two_homes), doctest::Contains("do not hold the homes' pages"),
                       oomb::invalid_argument);
  gpu_homes<float> unprepared;
  CHECK_THROWS_WITH_AS(unprepared.encode_pages(out, far, two_homes, near, two_slots), doctest::Contains("prepare() was not called"),
                       oomb::invalid_argument);
  CHECK(b.pages_written() == 0);  // nothing was encoded
  CHECK_THROWS_AS(oomb::launch_decode_pages<oomb::bf16_codec<float>>(nullptr, nullptr, nullptr, 1, 0, in.get()),
                  oomb::invalid_argument);
  sync_device();
}

TEST_CASE("cuda converting tier: a run of homes across two pinned allocations that touch moves as two copies") {
  using far_pool = oomb::block_pool<touching_pinned_resource>;
  using touching_homes =
      oomb::cuda_converting_backend<oomb::bf16_codec<float>, oomb::device_resource, oomb::cuda_stream, touching_pinned_resource>;
  const std::size_t home_bytes = 4096, n = home_bytes / 2;
  touching_pinned_resource pinned(4 * home_bytes);
  oomb::device_resource device;
  oomb::cuda_stream in, out, compute;
  far_pool far = far_pool::growing(pinned, home_bytes, 2, 4);  // slabs {0, 1} and {2, 3}
  std::vector<std::int32_t> pages(4);
  far.acquire(4, pages.data());
  REQUIRE(far.address(1) + home_bytes == far.address(2));  // the slabs touch
  MESSAGE("one cudaMemcpy over both registered slabs: " << copy_result(far.address(1), 2 * home_bytes)
                                                          << "; 64 KiB cudaHostAlloc blocks: " << touching_host_allocs());

  std::mt19937 rng(21);
  for (std::int32_t p : pages)
    for (std::size_t i = 0; i < n; ++i)
      reinterpret_cast<bf16*>(far.address(p))[i] = bf16(std::normal_distribution<float>(0.f, 1.f)(rng));
  oomb::residency_scheduler<touching_homes> sched(far, device, 4, in, out);
  sched.mark_written(pages);

  // Homes 0-3 into staging 0-3: a run on both sides, cut at the slabs' border.
  sched.prefetch(pages);
  CHECK(sched.stats().copies_to_near == 2);
  const auto slots = sched.acquire(compute.view(), pages, access::write);
  std::vector<float> slot(n);
  for (std::size_t k = 0; k < pages.size(); ++k) {
    auto* g = reinterpret_cast<float*>(sched.near_pool().address(slots[k]));
    OOMB_CUDA_CHECK(cudaMemcpyAsync(slot.data(), g, n * 4, cudaMemcpyDeviceToHost, compute.get()), "test: slot down");
    compute.synchronize();
    const bf16* home = reinterpret_cast<const bf16*>(far.address(pages[k]));
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(same_bits(slot[i], oomb::bf16_codec<float>::decode_element(home[i])));
      slot[i] *= 1.f + std::ldexp(1.f, -10);  // changes the rounded value of about one in 8
    }
    OOMB_CUDA_CHECK(cudaMemcpyAsync(g, slot.data(), n * 4, cudaMemcpyHostToDevice, compute.get()), "test: slot up");
    compute.synchronize();
  }
  sched.release(compute.view(), pages);

  // And back: staging 0-3 into homes 0-3, two copies again; the homes are the CPU codec's bits.
  std::vector<std::vector<float>> want(pages.size(), std::vector<float>(n));
  for (std::size_t k = 0; k < pages.size(); ++k)
    OOMB_CUDA_CHECK(cudaMemcpy(want[k].data(), sched.near_pool().address(slots[k]), n * 4, cudaMemcpyDeviceToHost),
                    "test: slot down");
  CHECK(sched.write_back(pages) == pages.size());
  sched.drain();
  CHECK(sched.stats().copies_to_far == 2);
  std::vector<bf16> encoded(n);
  for (std::size_t k = 0; k < pages.size(); ++k) {
    sched.backend().codec().encode(want[k].data(), encoded.data(), n, k);
    const bf16* home = reinterpret_cast<const bf16*>(far.address(pages[k]));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(home[i].bits == encoded[i].bits);
  }
}
