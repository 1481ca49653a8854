// device_page_table: the device copy follows a page_table through its change log, byte for byte.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/cuda/device_page_table.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/paging/page_table.hpp"

using namespace oomb_cuda_test;

namespace {

// A kernel reading the table through the view's accessors: per sequence, its length and the sum of
// its page ids (int64).
template <int = 0>
__global__ void read_view_kernel(oomb::page_table_view v, std::int64_t* len, std::int64_t* sum) {
  const int s = blockIdx.x;
  if (s >= v.num_seqs || threadIdx.x != 0) return;
  len[s] = v.seq_len(s);
  std::int64_t acc = 0;
  for (std::int32_t i = v.indptr[s]; i < v.indptr[s + 1]; ++i) acc += v.indices[i] * std::int64_t(i - v.indptr[s] + 1);
  sum[s] = acc;
}

// Copies layer `l` of the device table back and compares it with the host table's CSR export.
bool matches(const oomb::device_page_table& d, const oomb::page_table& t, std::int32_t l, cudaStream_t s) {
  const oomb::page_table_csr want = t.export_csr(l);
  const oomb::page_table_view v = d.view(l);
  if (v.num_seqs != want.num_seqs()) return false;
  std::vector<std::int32_t> indptr(want.indptr.size()), last(want.last_page_len.size()), idx(want.indices.size());
  OOMB_CUDA_CHECK(cudaMemcpyAsync(indptr.data(), v.indptr, indptr.size() * 4, cudaMemcpyDeviceToHost, s), "test");
  if (!last.empty())
    OOMB_CUDA_CHECK(cudaMemcpyAsync(last.data(), v.last_page_len, last.size() * 4, cudaMemcpyDeviceToHost, s), "test");
  if (!idx.empty())
    OOMB_CUDA_CHECK(cudaMemcpyAsync(idx.data(), v.indices, idx.size() * 4, cudaMemcpyDeviceToHost, s), "test");
  OOMB_CUDA_CHECK(cudaStreamSynchronize(s), "test");
  return indptr == want.indptr && last == want.last_page_len && idx == want.indices;
}

}  // namespace

TEST_CASE("device_page_table: batch 1 grows by deltas only; kernels read it through the view") {
  const std::int32_t layers = 4, page = 16;
  oomb::page_table t(layers, page);
  oomb::device_page_table d(layers, page, 4, 4096);
  oomb::cuda_stream s;
  std::mt19937 rng(5);
  std::int32_t next_id = 1000;
  const auto seq = t.add_sequence();
  d.sync(t, s);
  t.clear_changes();
  for (int chunk = 0; chunk < 30; ++chunk) {
    const std::int64_t tokens = 64;  // 4 pages per layer
    std::vector<std::int32_t> ids(static_cast<std::size_t>(t.pages_needed(seq, tokens) * layers));
    for (auto& id : ids) id = next_id + static_cast<std::int32_t>(rng() % 7), next_id += 7;
    t.append(seq, tokens, ids);
    d.sync(t, s);
    CHECK(d.last_writes() == ids.size() + 3);  // the new ids, indptr[0..1], last_page_len[0]
    t.clear_changes();
    for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, s.get()));
  }
  CHECK(d.relayouts() == 0);
  // A kernel through the POD view.
  device_buffer<std::int64_t> len(1), sum(1);
  read_view_kernel<><<<1, 32, 0, s.get()>>>(d.view(2), len.ptr, sum.ptr);
  OOMB_CUDA_CHECK_LAUNCH("test");
  std::int64_t hl = 0, hs = 0;
  OOMB_CUDA_CHECK(cudaMemcpyAsync(&hl, len.ptr, 8, cudaMemcpyDeviceToHost, s.get()), "test");
  OOMB_CUDA_CHECK(cudaMemcpyAsync(&hs, sum.ptr, 8, cudaMemcpyDeviceToHost, s.get()), "test");
  s.synchronize();
  CHECK(hl == t.seq_len(seq));
  std::int64_t want = 0;
  const oomb::id_span p = t.pages(seq, 2);
  for (std::size_t i = 0; i < p.size(); ++i) want += p[i] * std::int64_t(i + 1);
  CHECK(hs == want);
  // Partial last page, then pops.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(t.pages_needed(seq, 5) * layers), 77);
  t.append(seq, 5, ids);
  d.sync(t, s);
  t.clear_changes();
  for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, s.get()));
  (void)t.pop(seq, 5 + 64 * 3);
  d.sync(t, s);
  t.clear_changes();
  for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, s.get()));
}

TEST_CASE("device_page_table property: random batches of appends and pops, synced at random points") {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const std::int32_t layers = 1 + static_cast<std::int32_t>(rng() % 5), page = 16 << (rng() % 3);
    oomb::page_table t(layers, page);
    oomb::device_page_table d(layers, page, 16, 20000, 2);
    oomb::cuda_stream s;
    std::int32_t next_id = static_cast<std::int32_t>(rng() % 1000);
    const bool applied_twice = seed % 2 == 0;  // even seeds sync twice before clearing: harmless
    for (int op = 0; op < 120; ++op) {
      const int what = static_cast<int>(rng() % 10);
      if (t.num_seqs() < 16 && (t.num_seqs() == 0 || what == 0)) {
        t.add_sequence();
      } else if (what < 7) {
        const auto seq = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(t.num_seqs()));
        const std::int64_t tokens = 1 + rng() % (4 * page);
        const std::int32_t need = t.pages_needed(seq, tokens);
        if (t.pages_per_layer() + need > 20000) continue;
        std::vector<std::int32_t> ids(static_cast<std::size_t>(need * layers));
        for (auto& id : ids) id = next_id++;
        t.append(seq, tokens, ids);
      } else {
        const auto seq = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(t.num_seqs()));
        const std::int64_t len = t.seq_len(seq);
        if (len > 0) (void)t.pop(seq, 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(len)));
      }
      if (rng() % 3 == 0) {
        d.sync(t, s);
        if (applied_twice) d.sync(t, s);
        t.clear_changes();
        bool ok = true;
        for (std::int32_t l = 0; l < layers; ++l) ok &= matches(d, t, l, s.get());
        CHECK_MESSAGE(ok, "seed ", seed, " op ", op);
      }
    }
    d.sync(t, s);
    for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, s.get()));
  }
}

TEST_CASE("device_page_table: an inner sequence that grows moves the later ones on the device") {
  oomb::page_table t(3, 16);
  oomb::device_page_table d(3, 16, 4, 256);
  oomb::cuda_stream s;
  for (int i = 0; i < 3; ++i) t.add_sequence();
  std::int32_t next = 1;
  const auto grow = [&](std::int32_t seq, std::int64_t tokens) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(t.pages_needed(seq, tokens) * 3));
    for (auto& id : ids) id = next++;
    t.append(seq, tokens, ids);
  };
  grow(0, 40);
  grow(1, 20);
  grow(2, 70);
  d.sync(t, s);
  t.clear_changes();
  CHECK(d.relayouts() == 0);
  grow(0, 30);  // sequence 0: 3 -> 5 pages; 1 and 2 move by 2
  d.sync(t, s);
  t.clear_changes();
  CHECK(d.relayouts() == 1);
  for (std::int32_t l = 0; l < 3; ++l) CHECK(matches(d, t, l, s.get()));
  grow(2, 100);  // the last one: no move
  d.sync(t, s);
  t.clear_changes();
  CHECK(d.relayouts() == 1);
  for (std::int32_t l = 0; l < 3; ++l) CHECK(matches(d, t, l, s.get()));
  (void)t.pop(1, 20);  // 1 empties: 2 moves back
  d.sync(t, s);
  CHECK(d.relayouts() == 2);
  for (std::int32_t l = 0; l < 3; ++l) CHECK(matches(d, t, l, s.get()));
}

TEST_CASE("device_page_table: bad input throws before anything is enqueued") {
  oomb::page_table t(2, 16);
  oomb::cuda_stream s;
  CHECK_THROWS_AS(oomb::device_page_table(0, 16, 1, 1), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb::device_page_table(2, 24, 1, 1), oomb::invalid_argument);
  oomb::device_page_table other(3, 16, 4, 64);
  CHECK_THROWS_AS(other.sync(t, s), oomb::invalid_argument);  // geometry differs
  oomb::device_page_table small(2, 16, 1, 8);
  const auto a = t.add_sequence();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(t.pages_needed(a, 16 * 9) * 2), 3);
  t.append(a, 16 * 9, ids);
  CHECK_THROWS_AS(small.sync(t, s), oomb::invalid_argument);  // 9 pages per layer > 8
  t.add_sequence();
  (void)t.pop(a, 16 * 9);
  CHECK_THROWS_AS(small.sync(t, s), oomb::invalid_argument);  // 2 sequences > 1
  CHECK(small.num_seqs() == 0);
}

TEST_CASE("device_page_table: syncs on different streams apply in order, and sync never waits on the host") {
  // Sync 1 (the whole table) is held back on stream a behind a delay; sync 2 (the changed pages)
  // on stream b must not overtake it, or sync 1's old values would land last.
  const std::int32_t layers = 2, page = 16;
  oomb::page_table t(layers, page);
  oomb::device_page_table d(layers, page, 2, 256, /*staging_slots=*/2);
  oomb::cuda_stream a, b;
  std::mt19937 rng(11);
  const auto seq = t.add_sequence();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(t.pages_needed(seq, 64) * layers));
  for (auto& id : ids) id = 100 + static_cast<std::int32_t>(rng() % 900);
  t.append(seq, 64, ids);
  enqueue_delay(a.get(), 200'000'000);  // 200 ms
  oomb::cuda_event delayed = a.record();
  d.sync(t, a);
  t.clear_changes();
  t.pop(seq, 16, [](std::int32_t, std::int32_t, std::int32_t) {});  // replace the last page of each layer: a delta sync
  t.append(seq, 16, std::vector<std::int32_t>{7777, 8888});
  d.sync(t, b);
  t.clear_changes();
  b.synchronize();
  CHECK(delayed.ready());  // b's sync ran after a's, so waiting for b waited for a
  a.synchronize();
  for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, b.get()));

  // Stream a delayed again: the host issues more syncs than staging slots behind it, and each
  // returns at once (the ring grows; the old ring blocked the host on a slot still in flight).
  enqueue_delay(a.get(), 200'000'000);
  delayed = a.record();
  d.sync(t, a);
  for (int i = 0; i < 4; ++i) {
    t.pop(seq, 16, [](std::int32_t, std::int32_t, std::int32_t) {});
    t.append(seq, 16, std::vector<std::int32_t>{9000 + 2 * i, 9001 + 2 * i});
    d.sync(t, b);
    t.clear_changes();
  }
  CHECK_FALSE(delayed.ready());  // the host was never held up by stream a's delay
  b.synchronize();
  for (std::int32_t l = 0; l < layers; ++l) CHECK(matches(d, t, l, b.get()));
}
