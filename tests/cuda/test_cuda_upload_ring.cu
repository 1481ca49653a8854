// upload_ring: every reader sees its own table while later tables are uploaded, the host never
// waits, the ring grows only when every region is in flight, and bad calls change nothing.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/upload_ring.hpp"

using namespace oomb_cuda_test;

namespace {

// Table k: seeded random values, so a reader that saw another table's region (or a half-written
// one) gets another sum.
std::vector<std::int32_t> table(int k, int n) {
  std::mt19937 rng(1000u + static_cast<unsigned>(k));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng());
  return t;
}

// Holds a stream until the host opens it (writes 1 into mapped pinned memory), or 10 s pass
// (then *timed_out = 1): the stream is busy for exactly as long as the host says, whatever the
// speed of the host (compute-sanitizer slows host calls by orders of magnitude).
template <int = 0>
__global__ void gate_kernel(const volatile int* open, int* timed_out) {
  std::uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    if (*open != 0) return;
    __nanosleep(10000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < 10'000'000'000ull);
  *timed_out = 1;
}

class host_gate {
 public:
  host_gate() {
    void* p = nullptr;
    OOMB_CUDA_CHECK(cudaHostAlloc(&p, 2 * sizeof(int), cudaHostAllocMapped), "test gate");
    flags_ = static_cast<volatile int*>(p);
    flags_[0] = 0;
    flags_[1] = 0;
  }
  host_gate(const host_gate&) = delete;
  host_gate& operator=(const host_gate&) = delete;
  ~host_gate() { (void)cudaFreeHost(const_cast<int*>(flags_)); }
  void close(cudaStream_t s) {
    gate_kernel<><<<1, 1, 0, s>>>(flags_, const_cast<int*>(flags_ + 1));
    OOMB_CUDA_CHECK_LAUNCH("gate kernel");
  }
  void open() { flags_[0] = 1; }
  bool timed_out() const { return flags_[1] != 0; }

 private:
  volatile int* flags_ = nullptr;
};

std::vector<unsigned long long> download(const device_buffer<unsigned long long>& d) {
  std::vector<unsigned long long> h(d.n);
  OOMB_CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, d.n * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "test");
  return h;
}

}  // namespace

TEST_CASE("upload_ring: tables uploaded behind a slow stream; the host never waits, the ring grows") {
  oomb::cuda_stream stream;
  const oomb::cuda_stream_view s = stream.view();
  const int tables = quick() ? 24 : 64, n = 100;  // 400 bytes: 512-byte regions, 8 per 4 KiB
  oomb::upload_ring ring(4096);
  device_buffer<unsigned long long> sums(static_cast<std::size_t>(tables));
  OOMB_CUDA_CHECK(cudaMemset(sums.ptr, 0, sums.n * sizeof(unsigned long long)), "test");
  sync_device();

  // Nothing runs until the loop is done: every copy is pending while the host overwrites staging,
  // unless the ring keeps each table's pinned region until its copy and reader are done. An
  // upload that waited for the stream would never return (the gate times out after 10 s).
  // Under compute-sanitizer (OOMB_GPU_TEST_QUICK, as tools/gpu/tests.sh runs it) a launch returns
  // only once its kernel is done, so nothing can be held in flight: only the values are checked.
  const bool in_flight = !quick();
  host_gate gate;
  if (in_flight) gate.close(s.get());
  std::vector<std::vector<std::int32_t>> host;
  for (int k = 0; k < tables; ++k) {
    host.push_back(table(k, n));
    const auto t = ring.upload(host.back().data(), host.back().size(), s);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data) % oomb::upload_ring::region_alignment == 0);
    weighted_sum_kernel<><<<1, 128, 0, s.get()>>>(t.data, n, sums.ptr + k);
    OOMB_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
    ring.release(t, s);
  }
  MESSAGE("after " << tables << " tables: capacity " << ring.capacity() << " bytes, " << ring.growths() << " growths, "
                   << ring.held_bytes() << " pinned bytes held");
  if (in_flight) {
    CHECK(cudaStreamQuery(s.get()) == cudaErrorNotReady);
    gate.open();
    CHECK(ring.growths() >= 1);
    CHECK(ring.capacity() >= std::size_t(tables) * 512 / 2);  // the newest half at least sits in the current buffer
  }
  s.synchronize();
  CHECK_FALSE(gate.timed_out());  // the host reached the end of the loop with the stream held
  const auto got = download(sums);
  for (int k = 0; k < tables; ++k) CHECK_MESSAGE(got[std::size_t(k)] == host_weighted_sum(host[std::size_t(k)]), "table ", k);

  // Once the stream is idle, the regions are reclaimed: the same traffic needs no further growth.
  const std::size_t growths = ring.growths(), capacity = ring.capacity();
  OOMB_CUDA_CHECK(cudaMemset(sums.ptr, 0, sums.n * sizeof(unsigned long long)), "test");
  for (int k = 0; k < tables; ++k) {
    const auto t = ring.upload(host[std::size_t(k)].data(), host[std::size_t(k)].size(), s);
    weighted_sum_kernel<><<<1, 128, 0, s.get()>>>(t.data, n, sums.ptr + k);
    OOMB_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
    ring.release(t, s);
    if (k % 8 == 7) s.synchronize();
  }
  s.synchronize();
  CHECK(ring.growths() == growths);
  CHECK(ring.capacity() == capacity);
  const auto again = download(sums);
  for (int k = 0; k < tables; ++k) CHECK(again[std::size_t(k)] == host_weighted_sum(host[std::size_t(k)]));
}

TEST_CASE("upload_ring: a region is reused only after its reader on another stream is done") {
  // Copies on `copy`, slow readers (200 us each) on `compute`; the host paces itself so that
  // regions are reused while later readers are still in flight. A ring that freed a region when
  // its copy finished (ignoring the reader's event) would overwrite tables not yet read.
  oomb::cuda_stream copy, compute;
  const int tables = quick() ? 40 : 200, n = 100;
  oomb::upload_ring ring(4096);
  device_buffer<unsigned long long> sums(static_cast<std::size_t>(tables));
  OOMB_CUDA_CHECK(cudaMemset(sums.ptr, 0, sums.n * sizeof(unsigned long long)), "test");
  sync_device();
  std::vector<std::vector<std::int32_t>> host;
  for (int k = 0; k < tables; ++k) {
    host.push_back(table(7000 + k, n));
    const auto t = ring.upload(host.back().data(), host.back().size(), copy.view());
    compute.view().wait(copy.view().record());
    enqueue_delay(compute.get(), 200'000);
    weighted_sum_kernel<><<<1, 128, 0, compute.get()>>>(t.data, n, sums.ptr + k);
    OOMB_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
    ring.release(t, compute.view());
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  compute.view().synchronize();
  MESSAGE("two streams, " << tables << " tables: capacity " << ring.capacity() << " bytes, " << ring.growths()
                          << " growths");
  const auto got = download(sums);
  for (int k = 0; k < tables; ++k) CHECK_MESSAGE(got[std::size_t(k)] == host_weighted_sum(host[std::size_t(k)]), "table ", k);
}

TEST_CASE("upload_ring: bad calls throw and leave the ring as it was") {
  oomb::cuda_stream stream;
  const oomb::cuda_stream_view s = stream.view();
  CHECK_THROWS_AS(oomb::upload_ring(0), oomb::invalid_argument);
  CHECK_THROWS_WITH_AS(oomb::upload_ring(4096, 1024), doctest::Contains("max_capacity (1024 bytes) is below"),
                       oomb::invalid_argument);

  oomb::upload_ring ring(1024, 2048);
  const auto a = table(1, 128);  // 512 bytes: two regions per 1 KiB
  CHECK_THROWS_AS(ring.upload(a.data(), 0, s), oomb::invalid_argument);
  CHECK_THROWS_AS(ring.upload(static_cast<const std::int32_t*>(nullptr), 4, s), oomb::invalid_argument);
  const auto big = table(2, 1024);  // 4 KiB: above max_capacity
  CHECK_THROWS_WITH_AS(ring.upload(big.data(), big.size(), s), doctest::Contains("exceeds max_capacity (2048 bytes)"),
                       oomb::out_of_memory);

  // Hold regions unreleased: 2 fit, the 3rd grows the ring to 2 KiB (4 regions), the 7th cannot.
  std::vector<oomb::upload_ring::uploaded<std::int32_t>> held;
  for (int k = 0; k < 6; ++k) held.push_back(ring.upload(a.data(), a.size(), s));
  CHECK(ring.capacity() == 2048);
  CHECK(ring.growths() == 1);
  CHECK_THROWS_WITH_AS(ring.upload(a.data(), a.size(), s), doctest::Contains("would exceed max_capacity"),
                       oomb::out_of_memory);
  CHECK(ring.capacity() == 2048);
  CHECK(ring.regions_held() == 6);

  ring.release(held[0], s);
  CHECK_THROWS_WITH_AS(ring.release(held[0], s), doctest::Contains("released already"), oomb::invalid_argument);
  auto foreign = held[0];
  foreign.serial = 1000;
  CHECK_THROWS_AS(ring.release(foreign, s), oomb::invalid_argument);

  // Released and done: regions come back and the ring serves uploads again without growing.
  for (std::size_t k = 1; k < held.size(); ++k) ring.release(held[k], s);
  s.synchronize();
  device_buffer<unsigned long long> sum(1);
  OOMB_CUDA_CHECK(cudaMemset(sum.ptr, 0, sizeof(unsigned long long)), "test");
  const auto t = ring.upload(a.data(), a.size(), s);
  CHECK(ring.regions_held() == 1);
  weighted_sum_kernel<><<<1, 128, 0, s.get()>>>(t.data, static_cast<int>(a.size()), sum.ptr);
  OOMB_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
  ring.release(t, s);
  s.synchronize();
  CHECK(download(sum)[0] == host_weighted_sum(a));
  CHECK(ring.growths() == 1);
}
