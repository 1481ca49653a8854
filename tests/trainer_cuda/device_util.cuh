// Helpers of the CUDA op tests: device arrays filled from and read back to host vectors, bf16
// rounding of host data, and a stream.
// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <doctest/doctest.h>

#include <oomb/core/bf16.hpp>
#include <oomb/cuda/error.hpp>
#include <oomb/cuda/stream_view.hpp>

#include "test_util.hpp"

namespace ops_test {

using oomb::bf16;
using trainer_test::random_vector;
using trainer_test::rel_err;

/// A device array of n elements (freed on destruction), optionally uploaded from a host vector.
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : n_(n) { OOMB_CUDA_CHECK(cudaMalloc(&p_, bytes() > 0 ? bytes() : 1), "test array"); }
  explicit device_array(const std::vector<T>& h) : device_array(h.size()) { upload(h); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { (void)cudaFree(p_); }

  T* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::size_t bytes() const noexcept { return n_ * sizeof(T); }
  void upload(const std::vector<T>& h) {
    OOMB_CUDA_CHECK(cudaMemcpy(p_, h.data(), bytes(), cudaMemcpyHostToDevice), "test upload");
  }
  /// Synchronises the device (so kernel faults surface here) and copies back.
  std::vector<T> download() const {
    OOMB_CUDA_CHECK(cudaDeviceSynchronize(), "test sync");
    std::vector<T> h(n_);
    OOMB_CUDA_CHECK(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost), "test download");
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

/// Seeded uniform values rounded to bf16 (never all zero).
inline std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  const std::vector<float> f = random_vector<float>(n, seed, lo, hi);
  std::vector<bf16> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = bf16(f[i]);
  return b;
}

/// The exact fp32 values of bf16 data (what the CPU reference computes on).
inline std::vector<float> to_float(const std::vector<bf16>& b) {
  std::vector<float> f(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) f[i] = static_cast<float>(b[i]);
  return f;
}

/// Checks a norm-wise relative error against its tolerance and prints both, so the log holds
/// the measured errors that docs/trainer-ops.md quotes.
inline void expect_close(const char* what, double err, double tol) {
  MESSAGE(std::string(what) << ": relative error " << err << " (tolerance " << tol << ")");
  CHECK(err < tol);
}

/// A non-blocking stream for one test.
class test_stream {
 public:
  test_stream() { OOMB_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "test stream"); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  ~test_stream() { (void)cudaStreamDestroy(s_); }
  oomb::cuda_stream_view view() const noexcept { return oomb::cuda_stream_view(s_); }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace ops_test
