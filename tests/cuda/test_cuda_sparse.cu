// GPU page summaries and tile selection against the CPU's page_summaries, tile_scorer,
// page_selector and tile_selector, on seeded random inputs: exact equality, bit for bit.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "cuda_test_util.cuh"
#include "oomb/core/bf16.hpp"
#include "oomb/core/error.hpp"
#include "oomb/cuda/page_summary_kernels.cuh"
#include "oomb/cuda/staging_ring.hpp"
#include "oomb/cuda/stream.hpp"
#include "oomb/cuda/tile_selection.cuh"
#include "oomb/paging/page_shape.hpp"
#include "oomb/sparse/page_summaries.hpp"
#include "oomb/sparse/tile_selector.hpp"

using namespace oomb_cuda_test;

namespace {

template <class T>
void upload(device_buffer<T>& d, const std::vector<T>& h) {
  OOMB_CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
}
template <class T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> h(n);
  OOMB_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "test download");
  return h;
}

std::vector<oomb::bf16> random_bf16(std::size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<oomb::bf16> v(n);
  for (auto& x : v) x = oomb::bf16(dist(rng));
  return v;
}

// A device copy of host summaries (the store's arrays as they are).
struct device_summaries_copy {
  device_buffer<float> min, max, mean;
  device_buffer<std::int32_t> tokens;
  oomb::page_summary_view view;
  explicit device_summaries_copy(const oomb::page_summaries& s)
      : min(std::size_t(s.num_ids()) * s.kv_heads() * s.head_dim()), max(min.n), mean(min.n),
        tokens(std::size_t(s.num_ids())) {
    const oomb::page_summary_view h = s.view();
    upload(min, std::vector<float>(h.min, h.min + min.n));
    upload(max, std::vector<float>(h.max, h.max + min.n));
    upload(mean, std::vector<float>(h.mean, h.mean + min.n));
    upload(tokens, std::vector<std::int32_t>(h.tokens, h.tokens + tokens.n));
    view = h;
    view.min = min.ptr;
    view.max = max.ptr;
    view.mean = mean.ptr;
    view.tokens = tokens.ptr;
  }
};

template <int = 0>
__global__ void rank_keys_kernel(const float* s, const std::int32_t* idx, int n, std::uint64_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = oomb::page_rank_key(s[i], idx[i]);
}

struct selection_case {
  oomb::score_kind kind;
  std::int32_t q_heads, kv_heads, head_dim;
  std::int32_t queries, tile;
  std::int32_t budget, sink, local, past;
  bool repeated_ids;  // some logical pages share a page id: exact score ties
  bool head_major;    // queries stored [q_heads][n][d] (non-contiguous token stride)
};

// The test's model of the GPU: per tile, the query summary computed on the host in the kernel's
// order, scored by the same host/device functions, selected by the CPU's page_selector among the
// tile's candidates [min(first[t], past), past) (first empty: from 0), as tile_selector does.
std::vector<std::vector<std::int32_t>> reference_selection(const selection_case& c, const oomb::page_summaries& sums,
                                                           const oomb::tensor_view<const oomb::bf16, 3>& qv,
                                                           const std::vector<std::int32_t>& ids,
                                                           const std::vector<std::int32_t>& first = {}) {
  const std::int32_t group = c.q_heads / c.kv_heads, d = c.head_dim;
  const std::int32_t tiles = (c.queries + c.tile - 1) / c.tile;
  const oomb::selection_config pc{c.budget, c.sink, c.local};
  const oomb::page_summary_view s = sums.view();
  const auto st = qv.strides();
  std::vector<std::vector<std::int32_t>> rows;
  oomb::page_selector selector(pc);
  for (std::int32_t t = 0; t < tiles; ++t) {
    const std::int32_t t0 = t * c.tile, t1 = std::min(c.queries, t0 + c.tile);
    std::vector<float> lo(std::size_t(c.kv_heads) * d), hi(lo.size()), mean(lo.size());
    for (std::int32_t h = 0; h < c.kv_heads; ++h)
      for (std::int32_t ch = 0; ch < d; ++ch) {
        float mn = INFINITY, mx = -INFINITY;
        double sum = 0;
        for (std::int32_t g = 0; g < group; ++g)
          for (std::int32_t i = t0; i < t1; ++i) {
            const float x = static_cast<float>(qv.data()[i * st[0] + (h * group + g) * st[1] + ch * st[2]]);
            mn = std::min(mn, x);
            mx = std::max(mx, x);
            sum += x;
          }
        lo[std::size_t(h) * d + ch] = mn;
        hi[std::size_t(h) * d + ch] = mx;
        mean[std::size_t(h) * d + ch] = static_cast<float>(sum / (double(group) * (t1 - t0)));
      }
    const std::int32_t from = first.empty() ? 0 : std::min(first[std::size_t(t)], c.past), count = c.past - from;
    // Logical pages' scores from `from` on; sink and local are unread, earlier pages no candidates.
    std::vector<float> scores(std::size_t(count), std::numeric_limits<float>::quiet_NaN());
    if (count > pc.max_pages()) {
      const oomb::tensor_view<const oomb::bf16, 3> tile_q(qv.data() + t0 * st[0], {t1 - t0, c.q_heads, d}, st);
      oomb::tile_scorer per_query(c.kind, c.q_heads, c.kv_heads, d);  // the CPU's per-query score
      per_query.load(tile_q);
      oomb::tile_scorer mean_query(oomb::score_kind::mean, c.kv_heads, c.kv_heads, d);
      mean_query.load(oomb::tensor_view<const float, 3>(mean.data(), {1, c.kv_heads, d}, {std::int64_t(c.kv_heads) * d, d, 1}));
      for (std::int32_t i = from + c.sink; i < c.past - c.local; ++i) {
        const std::int32_t id = ids[std::size_t(i)];
        float best = -INFINITY;
        if (s.token_count(id) > 0)
          for (std::int32_t h = 0; h < c.kv_heads; ++h) {
            const float* a = (c.kind == oomb::score_kind::quest ? lo.data() : mean.data()) + std::size_t(h) * d;
            const float x = c.kind == oomb::score_kind::quest
                                ? oomb::quest_box_bound(a, hi.data() + std::size_t(h) * d, s.min_of(id, h), s.max_of(id, h), d)
                                : oomb::mean_key_score(a, s.mean_of(id, h), d);
            best = std::max(best, x);
          }
        scores[std::size_t(i - from)] = best;
        float cpu = 0;
        per_query.score(s, &id, 1, &cpu);
        if (c.kind == oomb::score_kind::quest) {
          // The box bounds every query's Quest bound exactly; a one-query tile without GQA is one.
          REQUIRE(best >= cpu);
          if (t1 - t0 == 1 && group == 1) REQUIRE(best == cpu);
        } else {
          float of_mean = 0;  // the CPU's mean-key score of the tile's mean query
          mean_query.score(s, &id, 1, &of_mean);
          REQUIRE(best == of_mean);
        }
      }
    }
    rows.emplace_back();
    selector.select(scores.data(), count, rows.back());
    for (std::int32_t& pg : rows.back()) pg += from;
  }
  return rows;
}

// select_tiles' output table: tile_indptr and its tile_pages.
struct selection_table {
  std::vector<std::int32_t> indptr, pages;
  bool operator==(const selection_table& o) const { return indptr == o.indptr && pages == o.pages; }
};

// Runs select_tiles on seeded random inputs against reference_selection, with per-tile first pages
// `first` (one a tile; empty: none, select_tiles without them) uploaded for the device.
selection_table run_selection_case(const selection_case& c, std::uint64_t seed,
                                   const std::vector<std::int32_t>& first = {}) {
  CAPTURE(oomb::to_string(c.kind));
  CAPTURE(c.q_heads);
  CAPTURE(c.kv_heads);
  CAPTURE(c.head_dim);
  CAPTURE(c.queries);
  CAPTURE(c.tile);
  CAPTURE(c.budget);
  CAPTURE(c.sink);
  CAPTURE(c.local);
  CAPTURE(c.past);
  std::mt19937_64 rng(seed);
  const std::int32_t d = c.head_dim, num_ids = c.past + 7;
  // Summaries of random pages: partial pages, a few empty ids, per-page offsets spread the scores.
  oomb::page_summaries sums(c.kv_heads, d, num_ids);
  std::uniform_int_distribution<std::int32_t> tokens_of(1, 16);
  std::normal_distribution<float> offset(0.0f, 0.5f);
  for (std::int32_t id = 0; id < num_ids; ++id) {
    if (id % 13 == 5) continue;  // empty: scores -infinity
    const std::int32_t n = tokens_of(rng);
    std::vector<float> k(std::size_t(n) * c.kv_heads * d);
    const float o = offset(rng);
    std::normal_distribution<float> key(o, 1.0f);
    for (auto& x : k) x = key(rng);
    sums.update(id, 0, oomb::tensor_view<const float, 3>(k.data(), {n, c.kv_heads, d}, {std::int64_t(c.kv_heads) * d, d, 1}));
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_ids));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::size_t(c.past));
  if (c.repeated_ids)
    for (std::size_t i = 1; i < ids.size(); i += 3) ids[i] = ids[i - 1];
  // Queries, bf16, token-major or head-major.
  const std::vector<oomb::bf16> q = random_bf16(std::size_t(c.queries) * c.q_heads * d, rng);
  const oomb::tensor_view<const oomb::bf16, 3>::index_array strides =
      c.head_major ? oomb::tensor_view<const oomb::bf16, 3>::index_array{d, std::int64_t(c.queries) * d, 1}
                   : oomb::tensor_view<const oomb::bf16, 3>::index_array{std::int64_t(c.q_heads) * d, d, 1};
  const oomb::tensor_view<const oomb::bf16, 3> host_q(q.data(), {c.queries, c.q_heads, d}, strides);

  const auto expected = reference_selection(c, sums, host_q, ids, first);
  if (c.tile == 1 && c.q_heads == c.kv_heads) {  // one-query tiles without GQA: the model is the CPU's selector
    oomb::tile_selector cpu({c.tile, c.kind, {c.budget, c.sink, c.local}}, c.q_heads, c.kv_heads, d);
    oomb::sparse_page_table table;
    if (first.empty()) cpu.select(sums.view(), host_q, ids.data(), c.past, table);
    else cpu.select(sums.view(), host_q, ids.data(), c.past, first.data(), table);
    for (std::int32_t t = 0; t < table.num_tiles(); ++t) {
      const auto [b, e] = table.tile(t);
      REQUIRE(std::vector<std::int32_t>(b, e) == expected[std::size_t(t)]);
    }
  }

  device_summaries_copy dsums(sums);
  // Only the statistics the kind reads: the kernels must not touch the others.
  if (c.kind == oomb::score_kind::quest) dsums.view.mean = nullptr;
  else dsums.view.min = dsums.view.max = nullptr;
  device_buffer<oomb::bf16> dq(q.size());
  upload(dq, q);
  device_buffer<std::int32_t> dids(std::max<std::size_t>(ids.size(), 1));
  if (!ids.empty()) upload(dids, ids);
  const std::int32_t tiles = (c.queries + c.tile - 1) / c.tile;
  const oomb::tile_selection_config config{c.tile, c.kind, {c.budget, c.sink, c.local}};
  // The past scored in one pass, and in slices of 1, 3 and budget + 2 pages: the running top-k
  // carries the best between passes, so every slicing must give the same table.
  std::optional<selection_table> one_pass;
  for (const std::int32_t slice : {oomb::default_selection_slice_pages, 1, 3, c.budget + 2}) {
    CAPTURE(slice);
    // A plan for a larger call than this one: the workspace is sized for the largest.
    const oomb::tile_selection_plan plan =
        oomb::plan_tile_selection(config, c.q_heads, c.kv_heads, d, tiles + 2, c.past + 5, slice);
    device_buffer<unsigned char> ws(plan.workspace_bytes);
    device_buffer<std::int32_t> indptr(std::size_t(tiles) + 1);
    device_buffer<std::int32_t> pages(std::size_t(std::max<std::int64_t>(plan.max_entries(), 1)));
    // Never-zero garbage in the outputs and workspace: whatever is not written shows.
    OOMB_CUDA_CHECK(cudaMemset(ws.ptr, 0x7b, plan.workspace_bytes), "test");
    OOMB_CUDA_CHECK(cudaMemset(indptr.ptr, 0x7b, indptr.n * 4), "test");
    OOMB_CUDA_CHECK(cudaMemset(pages.ptr, 0x7b, pages.n * 4), "test");
    oomb::cuda_stream stream;
    const oomb::tensor_view<const oomb::bf16, 3> dev_q(dq.ptr, {c.queries, c.q_heads, d}, strides, oomb::memory_kind::device);
    REQUIRE((first.empty() || first.size() == std::size_t(tiles)));
    device_buffer<std::int32_t> dfirst(std::max<std::size_t>(first.size(), 1));
    if (!first.empty()) upload(dfirst, first);
    const oomb::tile_selection_result r =
        oomb::select_tiles(plan, dsums.view, dev_q, dids.ptr, c.past, first.empty() ? nullptr : dfirst.ptr, indptr.ptr,
                           pages.ptr, ws.ptr, plan.workspace_bytes, stream.view());
    stream.synchronize();
    REQUIRE(r.tiles == tiles);
    REQUIRE(r.pages_per_tile == plan.pages_per_tile(c.past));
    const auto got_indptr = download(indptr.ptr, std::size_t(tiles) + 1);
    REQUIRE(got_indptr[0] == 0);
    REQUIRE(got_indptr[std::size_t(tiles)] <= tiles * r.pages_per_tile);
    REQUIRE(std::is_sorted(got_indptr.begin(), got_indptr.end()));
    const auto got_pages = download(pages.ptr, std::size_t(got_indptr[std::size_t(tiles)]));
    for (std::int32_t t = 0; t < tiles; ++t) {
      CAPTURE(t);
      // Without first pages every row is pages_per_tile long.
      if (first.empty()) REQUIRE(got_indptr[std::size_t(t)] == t * r.pages_per_tile);
      REQUIRE(got_indptr[std::size_t(t) + 1] - got_indptr[std::size_t(t)] == std::int32_t(expected[std::size_t(t)].size()));
      const std::vector<std::int32_t> row(got_pages.begin() + got_indptr[std::size_t(t)],
                                          got_pages.begin() + got_indptr[std::size_t(t) + 1]);
      REQUIRE(row == expected[std::size_t(t)]);
    }
    if (first.empty()) REQUIRE(got_indptr[std::size_t(tiles)] == tiles * r.pages_per_tile);
    const selection_table table{got_indptr, got_pages};
    if (one_pass) REQUIRE(table == *one_pass);
    else one_pass = table;
  }
  return *one_pass;
}

}  // namespace

TEST_CASE("summarize_pages: GPU page summaries equal the host's page_summaries bit for bit, filled in two rounds") {
  for (const oomb::kv_layout layout : {oomb::kv_layout::head_major, oomb::kv_layout::token_major}) {
    for (const std::int32_t head_dim : {64, 128}) {
      CAPTURE(head_dim);
      const oomb::page_shape shape{16, head_dim == 128 ? 4 : 2, head_dim, layout};
      const std::int32_t num_ids = 48;
      std::mt19937_64 rng(1234 + head_dim + int(layout));
      std::vector<oomb::bf16> pool = random_bf16(std::size_t(num_ids) * shape.pair_elements(), rng, 2.0f);
      device_buffer<oomb::bf16> dpool(pool.size());
      upload(dpool, pool);
      const auto host_pool = oomb::page_pool_view<const oomb::bf16>::over(pool.data(), shape);
      const auto dev_pool = oomb::page_pool_view<const oomb::bf16>::over(dpool.ptr, shape);

      // Round 1: 40 of the ids get a partial or full page; round 2 appends to them (some become
      // full), empties one (a released id) and leaves the rest as they were.
      std::vector<std::int32_t> ids(static_cast<std::size_t>(num_ids));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(40);
      std::vector<std::int32_t> first(ids.size()), second(ids.size());
      std::uniform_int_distribution<std::int32_t> count(1, shape.page_size);
      oomb::page_summaries host(shape.kv_heads, head_dim, num_ids);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        first[i] = count(rng);
        second[i] = i == 7 ? 0 : std::uniform_int_distribution<std::int32_t>(first[i], shape.page_size)(rng);
        host.update_from_pool(host_pool, ids[i], 0, first[i]);
      }
      device_buffer<std::int32_t> dids(ids.size()), dfirst(ids.size()), dsecond(ids.size());
      upload(dids, ids);
      upload(dfirst, first);
      upload(dsecond, second);
      oomb::cuda_stream stream;
      const oomb::summary_stats all_stats[] = {oomb::summary_stats::min_max_mean, oomb::summary_stats::min_max,
                                               oomb::summary_stats::mean};
      std::vector<std::unique_ptr<device_buffer<unsigned char>>> storage;
      std::vector<oomb::device_page_summaries> devs;
      for (const oomb::summary_stats stats : all_stats) {
        const std::size_t bytes = oomb::device_page_summaries::bytes(num_ids, shape.kv_heads, head_dim, stats);
        storage.push_back(std::make_unique<device_buffer<unsigned char>>(bytes));
        OOMB_CUDA_CHECK(cudaMemset(storage.back()->ptr, 0x5a, bytes), "test");
        devs.push_back(oomb::device_page_summaries::over(storage.back()->ptr, num_ids, shape.kv_heads, head_dim, stats));
        REQUIRE((devs.back().min == nullptr) == (stats == oomb::summary_stats::mean));
        REQUIRE((devs.back().mean == nullptr) == (stats == oomb::summary_stats::min_max));
        oomb::clear_page_summaries(devs.back(), stream.view());
        oomb::summarize_pages(dev_pool, dids.ptr, dfirst.ptr, std::int32_t(ids.size()), devs.back(), stream.view());
      }

      const auto compare = [&](const char* round) {
        CAPTURE(round);
        const std::size_t row = std::size_t(num_ids) * shape.kv_heads * head_dim;
        const oomb::page_summary_view h = host.view();
        stream.synchronize();
        for (const oomb::device_page_summaries& dev : devs) {
          const auto tk = download(dev.tokens, std::size_t(num_ids));
          REQUIRE(std::memcmp(tk.data(), h.tokens, tk.size() * 4) == 0);
          if (dev.min != nullptr) {
            const auto mn = download(dev.min, row), mx = download(dev.max, row);
            REQUIRE(std::memcmp(mn.data(), h.min, row * 4) == 0);
            REQUIRE(std::memcmp(mx.data(), h.max, row * 4) == 0);
          }
          if (dev.mean != nullptr) {
            const auto me = download(dev.mean, row);
            REQUIRE(std::memcmp(me.data(), h.mean, row * 4) == 0);
          }
        }
      };
      compare("round 1");
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (second[i] == 0)
          host.clear(ids[i]);
        else if (second[i] > first[i])
          host.update_from_pool(host_pool, ids[i], first[i], second[i] - first[i]);
      }
      for (const oomb::device_page_summaries& dev : devs)
        oomb::summarize_pages(dev_pool, dids.ptr, dsecond.ptr, std::int32_t(ids.size()), dev, stream.view());
      compare("round 2");
    }
  }
}

TEST_CASE("summarize_key_rows: summaries from a chunk's key rows equal the host's page_summaries bit for bit") {
  for (const std::int32_t head_dim : {64, 128}) {
    CAPTURE(head_dim);
    const std::int32_t kv_heads = head_dim == 128 ? 4 : 2, page = 16, num_ids = 20, pages = 7;
    const std::int64_t rows = std::int64_t(pages) * page - 9;  // a partial last page
    const std::int64_t kvd = std::int64_t(kv_heads) * head_dim;
    std::mt19937_64 rng(99 + head_dim);
    const std::vector<oomb::bf16> keys = random_bf16(std::size_t(rows * kvd), rng, 2.0f);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_ids));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(std::size_t(pages) + 1);  // one id past the last row: emptied
    oomb::page_summaries host(kv_heads, head_dim, num_ids);
    for (std::int32_t i = 0; i < pages; ++i) {
      const std::int64_t n = std::min<std::int64_t>(page, rows - std::int64_t(i) * page);
      host.update(ids[std::size_t(i)], 0,
                  oomb::tensor_view<const oomb::bf16, 3>(keys.data() + std::int64_t(i) * page * kvd, {n, kv_heads, head_dim},
                                                         {kvd, head_dim, 1}));
    }
    device_buffer<oomb::bf16> dkeys(keys.size());
    upload(dkeys, keys);
    device_buffer<std::int32_t> dids(ids.size());
    upload(dids, ids);
    const std::size_t bytes = oomb::device_page_summaries::bytes(num_ids, kv_heads, head_dim);
    device_buffer<unsigned char> storage(bytes);
    const auto dev = oomb::device_page_summaries::over(storage.ptr, num_ids, kv_heads, head_dim);
    oomb::cuda_stream stream;
    oomb::clear_page_summaries(dev, stream.view());
    // The last id first gets a page of garbage, then is emptied by the launch (no rows for it).
    oomb::summarize_key_rows(dkeys.ptr, page, page, dids.ptr + pages, 1, dev, stream.view());
    oomb::summarize_key_rows(dkeys.ptr, rows, page, dids.ptr, std::int32_t(ids.size()), dev, stream.view());
    stream.synchronize();
    const std::size_t row = std::size_t(num_ids) * kvd;
    const oomb::page_summary_view h = host.view();
    REQUIRE(std::memcmp(download(dev.tokens, std::size_t(num_ids)).data(), h.tokens, std::size_t(num_ids) * 4) == 0);
    REQUIRE(std::memcmp(download(dev.min, row).data(), h.min, row * 4) == 0);
    REQUIRE(std::memcmp(download(dev.max, row).data(), h.max, row * 4) == 0);
    REQUIRE(std::memcmp(download(dev.mean, row).data(), h.mean, row * 4) == 0);
    // rows == 0 empties every listed page: what host.clear does.
    oomb::summarize_key_rows<oomb::bf16>(nullptr, 0, page, dids.ptr, 3, dev, stream.view());
    for (std::size_t i = 0; i < 3; ++i) host.clear(ids[i]);
    stream.synchronize();
    REQUIRE(std::memcmp(download(dev.tokens, std::size_t(num_ids)).data(), h.tokens, std::size_t(num_ids) * 4) == 0);
    REQUIRE(std::memcmp(download(dev.min, row).data(), h.min, row * 4) == 0);
    REQUIRE(std::memcmp(download(dev.max, row).data(), h.max, row * 4) == 0);
    REQUIRE(std::memcmp(download(dev.mean, row).data(), h.mean, row * 4) == 0);
  }
}

TEST_CASE("gather_page_summaries: entries of a far-tier (mapped pinned) or device store copied bit for bit, all statistics or a subset") {
  for (const oomb::summary_stats stats : {oomb::summary_stats::min_max, oomb::summary_stats::mean,
                                          oomb::summary_stats::min_max_mean}) {
    for (const bool pinned_source : {true, false}) {
      CAPTURE(static_cast<int>(stats));
      CAPTURE(pinned_source);
      const std::int32_t kv_heads = 4, head_dim = 128, num_ids = 37, count = 23;
      std::mt19937_64 rng(7 + static_cast<int>(stats) * 2 + pinned_source);
      // A source store of random contents: every float and token count distinct from its neighbours.
      const std::size_t bytes = oomb::device_page_summaries::bytes(num_ids, kv_heads, head_dim, stats);
      std::vector<unsigned char> host_src(bytes);
      {
        std::normal_distribution<float> dist(0.0f, 3.0f);
        const auto layout = oomb::device_page_summaries::over(host_src.data(), num_ids, kv_heads, head_dim, stats);
        const std::size_t floats = (reinterpret_cast<unsigned char*>(layout.tokens) - host_src.data()) / sizeof(float);
        auto* f = reinterpret_cast<float*>(host_src.data());
        for (std::size_t i = 0; i < floats; ++i) f[i] = dist(rng);
        for (std::int32_t i = 0; i < num_ids; ++i) layout.tokens[i] = static_cast<std::int32_t>(rng() % 129);
      }
      oomb::pinned_staging<unsigned char> pinned;
      device_buffer<unsigned char> dsrc(pinned_source ? 1 : bytes);
      void* src_storage = nullptr;
      if (pinned_source) {
        pinned = oomb::make_pinned_staging<unsigned char>(bytes, cudaHostAllocMapped, "test");
        std::memcpy(pinned.get(), host_src.data(), bytes);
        src_storage = pinned.get();  // unified addressing: the host pointer is the device's too
      } else {
        upload(dsrc, host_src);
        src_storage = dsrc.ptr;
      }
      const auto src = oomb::device_page_summaries::over(src_storage, num_ids, kv_heads, head_dim, stats);
      std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
      for (auto& id : ids) id = static_cast<std::int32_t>(rng() % num_ids);  // repeats allowed
      ids[0] = num_ids - 1;
      device_buffer<std::int32_t> dids(ids.size());
      upload(dids, ids);
      const std::int32_t capacity = count + 5;
      const std::size_t dst_bytes = oomb::device_page_summaries::bytes(capacity, kv_heads, head_dim, stats);
      device_buffer<unsigned char> dst_storage(dst_bytes);
      const auto dst = oomb::device_page_summaries::over(dst_storage.ptr, capacity, kv_heads, head_dim, stats);
      oomb::cuda_stream stream;
      oomb::gather_page_summaries(src, dids.ptr, count, dst, stream.view());
      stream.synchronize();
      std::vector<unsigned char> got = download(dst_storage.ptr, dst_bytes);
      const auto h_src = oomb::device_page_summaries::over(host_src.data(), num_ids, kv_heads, head_dim, stats);
      const auto h_dst = oomb::device_page_summaries::over(got.data(), capacity, kv_heads, head_dim, stats);
      const std::size_t row = std::size_t(kv_heads) * head_dim * sizeof(float);
      for (std::int32_t i = 0; i < count; ++i) {
        const std::int32_t id = ids[std::size_t(i)];
        CAPTURE(i);
        CHECK(h_dst.tokens[i] == h_src.tokens[id]);
        if (h_src.min != nullptr) {
          CHECK(std::memcmp(h_dst.min + std::size_t(i) * row / 4, h_src.min + std::size_t(id) * row / 4, row) == 0);
          CHECK(std::memcmp(h_dst.max + std::size_t(i) * row / 4, h_src.max + std::size_t(id) * row / 4, row) == 0);
        }
        if (h_src.mean != nullptr)
          CHECK(std::memcmp(h_dst.mean + std::size_t(i) * row / 4, h_src.mean + std::size_t(id) * row / 4, row) == 0);
      }
      // Bad input: more entries than the destination holds, stores of different shapes or statistics.
      CHECK_THROWS_AS(oomb::gather_page_summaries(src, dids.ptr, capacity + 1, dst, stream.view()), oomb::invalid_argument);
      const auto narrow = oomb::device_page_summaries::over(dst_storage.ptr, 1, kv_heads, head_dim / 2, stats);
      CHECK_THROWS_AS(oomb::gather_page_summaries(src, dids.ptr, 1, narrow, stream.view()), oomb::invalid_argument);
      if (stats != oomb::summary_stats::min_max_mean) {  // a statistic the source lacks
        const oomb::summary_stats other =
            stats == oomb::summary_stats::mean ? oomb::summary_stats::min_max : oomb::summary_stats::mean;
        const auto unlike = oomb::device_page_summaries::over(dst_storage.ptr, 1, kv_heads, head_dim, other);
        CHECK_THROWS_AS(oomb::gather_page_summaries(src, dids.ptr, 1, unlike, stream.view()), oomb::invalid_argument);
        continue;
      }
      // From a store of all three, a store for one scoring kind takes only what it keeps.
      for (const oomb::summary_stats kept : {oomb::summary_stats::min_max, oomb::summary_stats::mean}) {
        CAPTURE(static_cast<int>(kept));
        const std::size_t kept_bytes = oomb::device_page_summaries::bytes(capacity, kv_heads, head_dim, kept);
        OOMB_CUDA_CHECK(cudaMemset(dst_storage.ptr, 0x7b, dst_bytes), "test");
        const auto narrower = oomb::device_page_summaries::over(dst_storage.ptr, capacity, kv_heads, head_dim, kept);
        oomb::gather_page_summaries(src.view(), dids.ptr, count, narrower, stream.view());
        stream.synchronize();
        std::vector<unsigned char> part = download(dst_storage.ptr, kept_bytes);
        const auto h_part = oomb::device_page_summaries::over(part.data(), capacity, kv_heads, head_dim, kept);
        for (std::int32_t i = 0; i < count; ++i) {
          const std::int32_t id = ids[std::size_t(i)];
          CAPTURE(i);
          CHECK(h_part.tokens[i] == h_src.tokens[id]);
          if (kept == oomb::summary_stats::min_max) {
            CHECK(std::memcmp(h_part.min + std::size_t(i) * row / 4, h_src.min + std::size_t(id) * row / 4, row) == 0);
            CHECK(std::memcmp(h_part.max + std::size_t(i) * row / 4, h_src.max + std::size_t(id) * row / 4, row) == 0);
          } else {
            CHECK(std::memcmp(h_part.mean + std::size_t(i) * row / 4, h_src.mean + std::size_t(id) * row / 4, row) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("summaries: the bytes the 7B's summaries take, as docs/sparse.md states them") {
  // Qwen2.5-7B: 28 layers, 4 KV heads, head_dim 128; 10,000 tokens in 128-token pages.
  const std::size_t per_page = 28 * oomb::device_page_summaries::bytes_per_id(4, 128);
  CHECK(per_page == 172144);
  CHECK(double(per_page) * 10000 / 128 == doctest::Approx(13.45e6).epsilon(0.001));
  // A store for one scoring kind keeps only what it reads.
  CHECK(28 * oomb::device_page_summaries::bytes_per_id(4, 128, oomb::summary_stats_for(oomb::score_kind::quest)) == 114800);
  CHECK(28 * oomb::device_page_summaries::bytes_per_id(4, 128, oomb::summary_stats_for(oomb::score_kind::mean)) == 57456);
}

TEST_CASE("page_rank_key on the device equals page_selector::rank_key, NaN, infinities and signed zeros included") {
  std::mt19937_64 rng(77);
  std::vector<float> s = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f, 3.4e38f, -3.4e38f, 1.0f, -1.0f};
  while (s.size() < 20000) {
    const std::uint32_t bits = static_cast<std::uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    s.push_back(f);
  }
  std::vector<std::int32_t> idx(s.size());
  for (auto& i : idx) i = static_cast<std::int32_t>(rng() % 1000000);
  device_buffer<float> ds(s.size());
  device_buffer<std::int32_t> di(s.size());
  device_buffer<std::uint64_t> dk(s.size());
  upload(ds, s);
  upload(di, idx);
  rank_keys_kernel<<<int(s.size() + 255) / 256, 256>>>(ds.ptr, di.ptr, int(s.size()), dk.ptr);
  sync_device();
  const auto keys = download(dk.ptr, s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    CAPTURE(s[i]);
    REQUIRE(keys[i] == oomb::page_selector::rank_key(s[i], idx[i]));
    REQUIRE(oomb::page_rank_key(s[i], idx[i]) == keys[i]);
  }
}

TEST_CASE("select_tiles: the GPU's selection equals the CPU's (page_selector over the same tile scores)") {
  using K = oomb::score_kind;
  const selection_case cases[] = {
      // kind, q_heads, kv_heads, d, queries, tile, budget, sink, local, past, repeated ids, head-major
      {K::quest, 8, 2, 64, 300, 128, 5, 1, 2, 60, false, false},
      {K::mean, 8, 2, 64, 300, 128, 5, 1, 2, 60, false, true},
      {K::quest, 4, 4, 128, 256, 128, 0, 2, 3, 50, false, false},  // B = 0: sink and local only
      {K::quest, 8, 2, 64, 200, 64, 8, 4, 4, 14, false, false},    // past within budget: every page
      {K::mean, 8, 2, 64, 200, 64, 8, 4, 4, 17, false, false},     // one page over: scored, B of 9
      {K::quest, 28, 4, 128, 130, 128, 16, 1, 1, 400, true, false},  // 7B heads, exact ties
      {K::mean, 28, 4, 128, 129, 128, 64, 0, 0, 1000, true, true},
      {K::quest, 8, 2, 64, 1000, 128, 3, 1, 1, 6, false, false},   // 4 middle pages, 3 kept
      {K::mean, 8, 8, 64, 70, 16, 40, 2, 2, 200, false, false},
      {K::quest, 8, 2, 64, 50, 128, 4, 1, 2, 0, false, false},     // no past
      {K::quest, 2, 2, 64, 37, 1, 6, 1, 1, 90, true, false},       // one-query tiles without GQA
      {K::quest, 16, 8, 128, 300, 128, 10, 1, 2, 120, false, false},  // 8 x 128 channels: a tile per block
      {K::mean, 16, 8, 128, 300, 128, 10, 1, 2, 120, true, false},
  };
  std::uint64_t seed = 2026;
  for (const selection_case& c : cases) run_selection_case(c, seed++);
}

TEST_CASE("select_tiles: one-query tiles without GQA equal the CPU's tile_selector exactly, quest and mean") {
  for (const oomb::score_kind kind : {oomb::score_kind::quest, oomb::score_kind::mean}) {
    CAPTURE(oomb::to_string(kind));
    std::mt19937_64 rng(99 + int(kind));
    const std::int32_t heads = 4, d = 128, n = 20, past = 300, num_ids = 320;
    oomb::page_summaries sums(heads, d, num_ids);
    for (std::int32_t id = 0; id < num_ids; ++id) {
      const std::int32_t t = 1 + std::int32_t(rng() % 16);
      const auto k = random_bf16(std::size_t(t) * heads * d, rng);
      sums.update(id, 0, oomb::tensor_view<const oomb::bf16, 3>(k.data(), {t, heads, d}, {heads * d, d, 1}));
    }
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_ids));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const auto q = random_bf16(std::size_t(n) * heads * d, rng);
    const oomb::tile_selection_config config{1, kind, {12, 2, 3}};
    oomb::tile_selector cpu(config, heads, heads, d);
    oomb::sparse_page_table table;
    cpu.select(sums.view(), oomb::tensor_view<const oomb::bf16, 3>(q.data(), {n, heads, d}, {heads * d, d, 1}), ids.data(),
               past, table);

    const device_summaries_copy dsums(sums);
    device_buffer<oomb::bf16> dq(q.size());
    upload(dq, q);
    device_buffer<std::int32_t> dids(ids.size());
    upload(dids, ids);
    const auto plan = oomb::plan_tile_selection(config, heads, heads, d, n, past);
    device_buffer<unsigned char> ws(plan.workspace_bytes);
    device_buffer<std::int32_t> indptr(std::size_t(n) + 1), pages(std::size_t(plan.max_entries()));
    oomb::cuda_stream stream;
    oomb::select_tiles(plan, dsums.view,
                       oomb::tensor_view<const oomb::bf16, 3>(dq.ptr, {n, heads, d}, {heads * d, d, 1}, oomb::memory_kind::device),
                       dids.ptr, past, indptr.ptr, pages.ptr, ws.ptr, plan.workspace_bytes, stream.view());
    stream.synchronize();
    REQUIRE(download(indptr.ptr, indptr.n) == table.indptr());
    REQUIRE(download(pages.ptr, table.indices().size()) == table.indices());
  }
}

TEST_CASE("select_tiles and plan_tile_selection: bad input throws before anything is enqueued") {
  const oomb::tile_selection_config config{128, oomb::score_kind::quest, {4, 1, 1}};
  CHECK_THROWS_AS(oomb::plan_tile_selection(config, 6, 4, 64, 4, 100), oomb::invalid_argument);  // 6 % 4
  CHECK_THROWS_AS(oomb::plan_tile_selection(config, 8, 2, 64, 0, 100), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb::plan_tile_selection({0, oomb::score_kind::quest, {}}, 8, 2, 64, 4, 100), oomb::invalid_argument);
  CHECK_THROWS_AS(oomb::plan_tile_selection(config, 8, 2, 64, 4, 100, 0), oomb::invalid_argument);  // no slice
  // Past one slice the workspace no longer grows with the past: 100K and 1M pages plan the same bytes.
  CHECK(oomb::plan_tile_selection(config, 8, 2, 64, 4, 100000).workspace_bytes ==
        oomb::plan_tile_selection(config, 8, 2, 64, 4, 1000000).workspace_bytes);
  CHECK(oomb::plan_tile_selection(config, 8, 2, 64, 4, 1000).workspace_bytes <
        oomb::plan_tile_selection(config, 8, 2, 64, 4, 100000).workspace_bytes);
  const auto plan = oomb::plan_tile_selection(config, 8, 2, 64, 2, 100);
  device_buffer<unsigned char> ws(plan.workspace_bytes);
  device_buffer<oomb::bf16> q(std::size_t(512) * 8 * 64);
  device_buffer<float> summary(std::size_t(200) * 2 * 64);
  device_buffer<std::int32_t> tokens(200), ids(200), indptr(8), pages(std::size_t(plan.max_entries()));
  oomb::page_summary_view s{summary.ptr, summary.ptr, summary.ptr, tokens.ptr, 200, 2, 64};
  oomb::cuda_stream stream;
  const auto view = [&](std::int64_t n, std::int64_t heads) {
    return oomb::tensor_view<const oomb::bf16, 3>(q.ptr, {n, heads, 64}, {heads * 64, 64, 1}, oomb::memory_kind::device);
  };
  const auto call = [&](const oomb::tensor_view<const oomb::bf16, 3>& qv, std::int32_t past, std::size_t bytes) {
    return oomb::select_tiles(plan, s, qv, ids.ptr, past, indptr.ptr, pages.ptr, ws.ptr, bytes, stream.view());
  };
  CHECK_THROWS_AS(call(view(257, 8), 50, plan.workspace_bytes), oomb::invalid_argument);  // 3 tiles > 2
  CHECK_THROWS_AS(call(view(256, 8), 101, plan.workspace_bytes), oomb::invalid_argument);  // past > plan
  CHECK_THROWS_AS(call(view(256, 8), 50, plan.workspace_bytes - 1), oomb::invalid_argument);
  CHECK_THROWS_AS(call(view(256, 4), 50, plan.workspace_bytes), oomb::invalid_argument);  // heads
  CHECK_THROWS_AS(call(view(0, 8), 50, plan.workspace_bytes), oomb::invalid_argument);
  s.max = nullptr;  // a mean-only store cannot serve quest scoring
  CHECK_THROWS_AS(call(view(256, 8), 50, plan.workspace_bytes), oomb::invalid_argument);
  s.max = summary.ptr;
  CHECK_THROWS_AS(oomb::select_tiles(plan, s, oomb::tensor_view<const oomb::bf16, 3>(q.ptr, {16, 8, 64}, {512, 64, 1}), ids.ptr,
                                     50, indptr.ptr, pages.ptr, ws.ptr, plan.workspace_bytes, stream.view()),
                  oomb::invalid_argument);  // host memory
  stream.synchronize();
}

namespace {

// First pages for `tiles` tiles over `past` pages, by tile index mod 8: 0; the past (no candidate);
// beyond it (clamped: none); max_pages before it (every candidate, unscored) and one more (scored);
// fewer candidates than max_pages; anywhere in [0, past] (mid-range) twice.
std::vector<std::int32_t> random_first_pages(std::int32_t tiles, std::int32_t past, std::int32_t max_pages,
                                             std::mt19937_64& rng) {
  std::vector<std::int32_t> first(static_cast<std::size_t>(tiles));
  for (std::int32_t t = 0; t < tiles; ++t) {
    std::int32_t f = 0;
    switch (t % 8) {
      case 0: f = 0; break;
      case 1: f = past; break;
      case 2: f = past + 1 + std::int32_t(rng() % 5); break;
      case 3: f = past - max_pages; break;
      case 4: f = past - max_pages - 1; break;
      case 5: f = past - 1 - std::int32_t(rng() % std::uint64_t(std::max(max_pages, 1))); break;
      default: f = std::int32_t(rng() % std::uint64_t(past + 1)); break;
    }
    first[std::size_t(t)] = std::max(f, 0);
  }
  return first;
}

}  // namespace

TEST_CASE("select_tiles with per-tile first pages (packed documents): tile t selects among [first_t, past) as the "
          "host model (and, for one-query tiles without GQA, the CPU's tile_selector) does") {
  using K = oomb::score_kind;
  const selection_case cases[] = {
      // kind, q_heads, kv_heads, d, queries, tile, budget, sink, local, past, repeated ids, head-major
      {K::quest, 8, 2, 64, 1100, 64, 5, 1, 2, 60, false, false},  // 18 tiles: groups of 8 and a partial one
      {K::mean, 8, 2, 64, 1100, 64, 5, 1, 2, 60, false, true},
      {K::quest, 28, 4, 128, 1100, 128, 16, 1, 1, 400, true, false},  // 7B heads, exact ties
      {K::mean, 28, 4, 128, 1000, 128, 64, 0, 0, 1000, true, true},
      {K::quest, 16, 8, 128, 1100, 128, 10, 1, 2, 120, false, false},  // 8 x 128 channels: a tile per block
      {K::mean, 16, 8, 128, 1100, 128, 10, 1, 2, 120, true, false},
      {K::quest, 4, 4, 128, 1024, 128, 0, 2, 3, 50, false, false},  // B = 0: sink and local only
      {K::quest, 8, 2, 64, 600, 64, 8, 4, 4, 14, false, false},     // past within budget: every candidate
      {K::mean, 8, 2, 64, 600, 64, 8, 4, 4, 17, false, false},      // one page over
      {K::quest, 8, 2, 64, 300, 128, 4, 1, 2, 0, false, false},     // no past
      {K::quest, 2, 2, 64, 37, 1, 6, 1, 1, 90, true, false},        // one-query tiles without GQA
      {K::mean, 2, 2, 64, 41, 1, 6, 1, 1, 90, false, true},
  };
  std::uint64_t seed = 3031;
  for (const selection_case& c : cases) {
    std::mt19937_64 rng(~seed);  // not the inputs' stream
    const std::int32_t tiles = (c.queries + c.tile - 1) / c.tile;
    const std::vector<std::int32_t> first = random_first_pages(tiles, c.past, c.budget + c.sink + c.local, rng);
    const selection_table got = run_selection_case(c, seed++, first);
    // Rows of tiles with fewer candidates than budget + sink + local are shorter.
    if (c.past > 0) REQUIRE(got.indptr.back() < tiles * std::min(c.past, c.budget + c.sink + c.local));
  }
}

TEST_CASE("select_tiles: no first pages (nullptr) give the output of first pages all 0, bit for bit, rows of "
          "pages_per_tile each") {
  using K = oomb::score_kind;
  const selection_case cases[] = {
      {K::quest, 8, 2, 64, 300, 128, 5, 1, 2, 60, false, false},
      {K::mean, 8, 2, 64, 1100, 64, 5, 1, 2, 60, false, true},
      {K::quest, 28, 4, 128, 130, 128, 16, 1, 1, 400, true, false},
      {K::mean, 16, 8, 128, 300, 128, 10, 1, 2, 120, true, false},
      {K::quest, 4, 4, 128, 256, 128, 0, 2, 3, 50, false, false},
      {K::quest, 8, 2, 64, 200, 64, 8, 4, 4, 14, false, false},
      {K::quest, 2, 2, 64, 37, 1, 6, 1, 1, 90, true, false},
  };
  std::uint64_t seed = 4041;
  for (const selection_case& c : cases) {
    const std::int32_t tiles = (c.queries + c.tile - 1) / c.tile;
    // Same seed, same inputs; nullptr is checked against the first-page-free model (the old rule).
    const selection_table none = run_selection_case(c, seed);
    REQUIRE(none == run_selection_case(c, seed, std::vector<std::int32_t>(std::size_t(tiles), 0)));
    ++seed;
  }
}
