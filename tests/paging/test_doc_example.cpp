// The usage example of docs/paging.md, compiled and run; a second test checks the doc still shows
// exactly this code.
// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "oomb/core/bf16.hpp"
#include "oomb/memory/host_resource.hpp"
#include "oomb/paging/grad_mirror.hpp"
#include "oomb/paging/paged_kv_cache.hpp"

TEST_CASE("docs/paging.md example") {
  // doc-begin
  oomb::host_resource host;

  oomb::paged_kv_config kc;
  kc.layers = 4;
  kc.shape = {/*page_size*/ 128, /*kv_heads*/ 2, /*head_dim*/ 64, oomb::kv_layout::head_major};
  kc.chunk_size = 512;                 // a multiple of page_size, or invalid_argument
  kc.pool.max_pages = 4 * 4 * 8;       // K/V page pairs, all layers together
  oomb::paged_kv_cache<oomb::bf16, oomb::host_resource> kv(host, kc);

  oomb::grad_mirror_config gc;
  gc.shape = kc.shape;
  gc.kv_ids = kv.pool().capacity();    // KV ids index the mirror's table
  gc.pool.max_pages = 64;
  oomb::grad_mirror<float, oomb::host_resource> grads(host, gc);  // fp32 gradients for bf16 K/V

  const std::int32_t seq = kv.add_sequence();
  for (int chunk = 0; chunk < 3; ++chunk) {
    const std::int64_t first = kv.append(seq, 512);   // all layers or nothing (out_of_memory)
    for (std::int32_t layer = 0; layer < kc.layers; ++layer)
      for (std::int64_t pos = first; pos < first + 512; ++pos)
        for (std::int32_t h = 0; h < 2; ++h) {
          oomb::bf16* k = kv.k(seq, layer, pos, h);      // head_dim contiguous values
          oomb::bf16* v = kv.v(seq, layer, pos, h);
          for (int d = 0; d < 64; ++d) k[d] = v[d] = oomb::bf16(0.01f * float(d + h));
        }
  }

  // Kernels and CPU references read a layer through a POD view.
  const oomb::paged_kv_view<oomb::bf16> layer0 = kv.view(0);
  CHECK(layer0.table.seq_len(seq) == 1536);
  CHECK(static_cast<float>(layer0.k_at(seq, 700, 1)[3]) == static_cast<float>(oomb::bf16(0.04f)));

  // Backward of the last chunk adds into the gradient pages of the past ones.
  const auto [past_begin, past_end] = kv.chunk_pages(seq, 0);
  std::vector<float> dk(static_cast<std::size_t>(kc.shape.page_elements()), 0.5f);
  kv.for_each_page(seq, /*layer*/ 2, past_begin, past_end, [&](std::int32_t, std::int32_t id) {
    grads.accumulate(id, dk.data(), nullptr);          // zero-filled on first touch
  });
  CHECK(grads.num_touched() == past_end - past_begin);

  // Release chunk by chunk from the end, each KV page with its gradient page.
  while (kv.pop_chunk(seq, [&](std::int32_t id) { grads.release_if_touched(id); }) > 0) {
  }
  CHECK(kv.stats().in_use == 0);
  CHECK(grads.num_touched() == 0);
  // doc-end
}

namespace {
std::string between(const std::string& text, const std::string& open, const std::string& close) {
  const auto a = text.find(open);
  REQUIRE(a != std::string::npos);
  const auto b = text.find(close, a + open.size());
  REQUIRE(b != std::string::npos);
  return text.substr(a + open.size(), b - a - open.size());
}
std::string read(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
/// Lines with their common indentation removed.
std::string dedent(const std::string& block) {
  std::vector<std::string> lines;
  std::stringstream ss(block);
  std::string line;
  std::size_t indent = std::string::npos;
  while (std::getline(ss, line)) {
    lines.push_back(line);
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos) indent = std::min(indent, first);
  }
  std::string out;
  for (const auto& l : lines) {
    if (l.find_first_not_of(' ') == std::string::npos) continue;
    out += l.substr(indent) + "\n";
  }
  return out;
}
}  // namespace

TEST_CASE("docs/paging.md shows the example above verbatim") {
  const std::string here = __FILE__;
  const std::string root = here.substr(0, here.rfind("/tests/paging/"));
  const std::string code = dedent(between(read(here), "// doc-" "begin\n", "  // doc-" "end"));
  const std::string doc = dedent(between(read(root + "/docs/paging.md"), "<!-- example-begin -->\n```cpp\n",
                                         "```\n<!-- example-end -->"));
  CHECK(doc == code);
}
