// oomb quickstart: a long context's KV cache paged into a host far tier, streamed through a small
// near tier the way the chunk-recurrent trainer does it. CPU only; runs in seconds.
// SPDX-License-Identifier: Apache-2.0
//
//   stage 1, chunks 0 .. n-1:  for each layer, read the selected past pages through the near tier
//       (prefetching the next window while the current one is used), then produce the chunk's
//       K/V pages in near slots and write them home once.
//   stage 2, chunks n-1 .. 0:  for each layer (last first), stream the same pages again with
//       their gradient pages (zero-filled on first touch, accumulated, written back), then
//       release the chunk's K/V and gradient pages.
// The "compute" is a host stream standing in for the GPU: it checks every K/V page it reads
// against the values stage 1 wrote and adds 1 to every gradient element it visits, checking the
// count, so any ordering mistake shows up as a mismatch (and a non-zero exit code).
#include <oomb/core/bf16.hpp>
#include <oomb/memory/host_resource.hpp>
#include <oomb/offload/host_backend.hpp>
#include <oomb/offload/residency_scheduler.hpp>
#include <oomb/paging/grad_mirror.hpp>
#include <oomb/paging/paged_kv_cache.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace {

struct options {
  std::int64_t tokens = 1 << 20;  // 1M
  std::int32_t layers = 4;
  std::int32_t page_size = 128;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 8;
  std::int32_t chunk = 8192;
  std::int32_t window = 32;      // pages per compute window
  std::int32_t kv_slots = 128;   // near tier for K/V, in pages
  std::int32_t grad_slots = 128; // near tier for gradients, in pages
  std::int32_t sink = 4;         // first pages every chunk attends
  std::int32_t budget = 64;      // further past pages per chunk and layer (sparse selection)
  bool dense = false;            // attend every past page instead
  std::uint32_t seed = 1;
};

void usage() {
  std::cout << "usage: quickstart [--tokens N] [--layers N] [--page-size N] [--kv-heads N]\n"
               "                  [--head-dim N] [--chunk N] [--window N] [--kv-slots N]\n"
               "                  [--grad-slots N] [--sink N] [--budget N] [--dense] [--seed N]\n"
               "defaults: 1M tokens, 4 layers, 128-token pages, 1 KV head of dim 8, 8192-token\n"
               "chunks, windows of 32 pages, 128 near slots each for K/V and gradients, 4 sink pages\n"
               "plus 64 selected past pages per chunk and layer.\n";
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long long {
      if (i + 1 >= argc) throw oomb::invalid_argument("quickstart: " + a + " needs a value");
      return std::stoll(argv[++i]);
    };
    if (a == "--tokens") o.tokens = next();
    else if (a == "--layers") o.layers = static_cast<std::int32_t>(next());
    else if (a == "--page-size") o.page_size = static_cast<std::int32_t>(next());
    else if (a == "--kv-heads") o.kv_heads = static_cast<std::int32_t>(next());
    else if (a == "--head-dim") o.head_dim = static_cast<std::int32_t>(next());
    else if (a == "--chunk") o.chunk = static_cast<std::int32_t>(next());
    else if (a == "--window") o.window = static_cast<std::int32_t>(next());
    else if (a == "--kv-slots") o.kv_slots = static_cast<std::int32_t>(next());
    else if (a == "--grad-slots") o.grad_slots = static_cast<std::int32_t>(next());
    else if (a == "--sink") o.sink = static_cast<std::int32_t>(next());
    else if (a == "--budget") o.budget = static_cast<std::int32_t>(next());
    else if (a == "--seed") o.seed = static_cast<std::uint32_t>(next());
    else if (a == "--dense") o.dense = true;
    else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      throw oomb::invalid_argument("quickstart: unknown flag " + a + " (try --help)");
    }
  }
  if (o.tokens < 1) throw oomb::invalid_argument("quickstart: --tokens must be positive");
  if (o.window < 1) throw oomb::invalid_argument("quickstart: --window must be positive");
  return o;
}

std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What stage 1 writes: element (head, dim) of K (which = 0) or V (1) at a token position of a layer.
float kv_value(std::int32_t layer, std::int64_t pos, std::int32_t head, std::int32_t dim, int which) {
  return static_cast<float>((pos * 7 + layer * 13 + head * 5 + dim * 3 + which * 11) % 251) * 0.125f;
}

using kv_cache = oomb::paged_kv_cache<oomb::bf16, oomb::host_resource>;
using gradients = oomb::grad_mirror<float, oomb::host_resource>;
using scheduler = oomb::host_residency_scheduler;

// Splits `pages` into windows of `w`; for each: acquire (the compute stream waits for the copies),
// prefetch the next window, enqueue `work(first, window, slots)` on compute, release.
template <class Work>
void stream_windows(scheduler& s, oomb::host_stream& compute, const std::vector<std::int32_t>& pages,
                    std::int32_t w, oomb::access mode, Work&& work) {
  const std::size_t n = pages.size(), step = static_cast<std::size_t>(w);
  if (n == 0) return;
  // Pages about to be overwritten need no copy: they get their slots at acquire.
  const bool fetch = mode != oomb::access::overwrite;
  if (fetch) s.prefetch(oomb::id_span(pages.data(), std::min(step, n)));
  for (std::size_t first = 0; first < n; first += step) {
    const oomb::id_span win(pages.data() + first, std::min(step, n - first));
    const auto slots = s.acquire(compute, win, mode);
    if (fetch && first + step < n)
      s.prefetch(oomb::id_span(pages.data() + first + step, std::min(step, n - first - step)));
    work(first, win, slots);
    s.release(compute, win);
  }
}

void print_tier(const char* name, const scheduler& s, const oomb::block_pool_stats& far) {
  const auto st = s.stats();
  std::cout << "  " << name << ": far tier holds " << far.in_use << " pages ("
            << mib(double(far.in_use) * double(far.block_bytes)) << ", high water " << far.high_water
            << " pages, " << mib(double(far.reserved_bytes)) << " reserved); near tier holds "
            << st.resident << " of " << st.capacity << " slots (" << st.dirty << " dirty)\n";
}

void print_traffic(const char* name, const oomb::residency_stats& st) {
  std::cout << "  " << name << " moved: to near " << mib(double(st.bytes_to_near)) << " in "
            << st.copies_to_near << " copies, to far " << mib(double(st.bytes_to_far)) << " in "
            << st.copies_to_far << " copies; hits " << st.hits << ", misses " << st.misses << " ("
            << st.acquire_misses << " not prefetched), evictions " << st.evictions << ", write-backs "
            << st.write_backs << ", zero fills " << st.zero_fills << "\n";
}

int run(const options& opt) {
  const oomb::page_shape shape{opt.page_size, opt.kv_heads, opt.head_dim, oomb::kv_layout::head_major};
  shape.validate();
  const std::int64_t pages_per_layer = (opt.tokens + opt.page_size - 1) / opt.page_size;
  const std::int64_t total_pages = pages_per_layer * opt.layers;
  if (total_pages >= (std::int64_t(1) << 31))
    throw oomb::invalid_argument("quickstart: " + std::to_string(total_pages) + " pages exceed int32 ids");

  oomb::host_resource host;
  oomb::paged_kv_config kc;
  kc.layers = opt.layers;
  kc.shape = shape;
  kc.chunk_size = opt.chunk;
  kc.pool.max_pages = static_cast<std::int32_t>(total_pages);
  kc.pool.mode = oomb::pool_mode::growing;  // the far tier grows slab by slab with the context
  kc.pool.pages_per_slab = 1024;
  kv_cache cache(host, kc);

  oomb::grad_mirror_config gc;
  gc.shape = shape;
  gc.kv_ids = static_cast<std::int32_t>(total_pages);
  gc.pool = kc.pool;
  gradients grads(host, gc);

  // Host streams standing in for the GPU's: one compute stream; per tier pair (K/V, gradients) a
  // scheduler with its own near tier, copy-in stream and write-back stream.
  oomb::host_stream compute, kv_in, kv_out, g_in, g_out;
  scheduler kv(cache.pool(), host, opt.kv_slots, kv_in, kv_out);
  scheduler gs(grads.pool(), host, opt.grad_slots, g_in, g_out);

  const std::int64_t pe = shape.page_elements();
  const std::int32_t seq = cache.add_sequence();
  const std::int32_t chunks = static_cast<std::int32_t>((opt.tokens + opt.chunk - 1) / opt.chunk);
  std::atomic<long long> kv_bad{0}, grad_bad{0}, kv_checked{0}, grad_checked{0};

  std::cout << "oomb quickstart: " << opt.tokens << " tokens, " << opt.layers << " layers, " << chunks
            << " chunks of " << opt.chunk << " tokens; pages of " << opt.page_size << " tokens x "
            << opt.kv_heads << " KV heads x dim " << opt.head_dim << "\n"
            << "  K/V: " << total_pages << " pages (bf16 K/V pairs of " << cache.pair_bytes()
            << " bytes, " << mib(double(total_pages) * double(cache.pair_bytes())) << "), gradients fp32 ("
            << grads.pair_bytes() << " bytes a pair)\n"
            << "  near tiers: " << opt.kv_slots << " K/V slots ("
            << mib(double(opt.kv_slots) * double(cache.pair_bytes())) << ") and " << opt.grad_slots
            << " gradient slots (" << mib(double(opt.grad_slots) * double(grads.pair_bytes()))
            << "); windows of " << opt.window << " pages; "
            << (opt.dense ? std::string("dense: every past page")
                          : std::to_string(opt.sink) + " sink + " + std::to_string(opt.budget) +
                                " selected past pages")
            << " per chunk and layer\n";

  // Checks, on the compute stream, K and V of a page's first and last token against kv_value.
  const std::int64_t tokens = opt.tokens;
  auto check_kv = [&shape, &kv_bad, &kv_checked, tokens, pe](const oomb::bf16* pair, std::int32_t layer,
                                                              std::int64_t pos0) {
    const std::int64_t valid = std::min<std::int64_t>(shape.page_size, tokens - pos0);
    for (std::int64_t t : {std::int64_t(0), valid - 1})
      for (std::int32_t h = 0; h < shape.kv_heads; ++h)
        for (std::int32_t d = 0; d < shape.head_dim; ++d)
          for (int which = 0; which < 2; ++which) {
            const oomb::bf16 got = pair[which * pe + h * shape.stride_head() + t * shape.stride_token() + d];
            if (got.bits != oomb::bf16(kv_value(layer, pos0 + t, h, d, which)).bits) ++kv_bad;
          }
    ++kv_checked;
  };

  // selection[c][l]: logical past pages chunk c attends in layer l (chosen in stage 1, reused in 2).
  std::vector<std::vector<std::vector<std::int32_t>>> selection(static_cast<std::size_t>(chunks));
  std::vector<oomb::host_event> step_done(static_cast<std::size_t>(chunks));
  std::mt19937 rng(opt.seed);

  // ---------------- stage 1: chunks in order; K/V produced near, written home once ----------------
  const auto t1 = std::chrono::steady_clock::now();
  for (std::int32_t c = 0; c < chunks; ++c) {
    const std::int64_t start = std::int64_t(c) * opt.chunk;
    cache.append(seq, std::min<std::int64_t>(opt.chunk, opt.tokens - start));
    const auto [first, last] = cache.chunk_pages(seq, c);
    auto& sel_c = selection[static_cast<std::size_t>(c)];
    sel_c.resize(static_cast<std::size_t>(opt.layers));
    for (std::int32_t l = 0; l < opt.layers; ++l) {
      std::vector<std::int32_t>& sel = sel_c[static_cast<std::size_t>(l)];
      for (std::int32_t p = 0; p < std::min(opt.sink, first); ++p) sel.push_back(p);
      std::vector<std::int32_t> rest;
      for (std::int32_t p = std::min(opt.sink, first); p < first; ++p) rest.push_back(p);
      if (!opt.dense && static_cast<std::int32_t>(rest.size()) > opt.budget) {
        std::shuffle(rest.begin(), rest.end(), rng);
        rest.resize(static_cast<std::size_t>(std::max(0, opt.budget)));
        std::sort(rest.begin(), rest.end());
      }
      sel.insert(sel.end(), rest.begin(), rest.end());

      // Attention over the selected past: read each page through the near tier.
      std::vector<std::int32_t> past;
      for (std::int32_t p : sel) past.push_back(cache.page_id(seq, l, p));
      stream_windows(kv, compute, past, opt.window, oomb::access::read,
                     [&](std::size_t off, oomb::id_span win, const std::vector<std::int32_t>& slots) {
                       for (std::size_t i = 0; i < win.size(); ++i) {
                         const auto* pair = reinterpret_cast<const oomb::bf16*>(kv.near_pool().address(slots[i]));
                         const std::int64_t pos0 = std::int64_t(sel[off + i]) * opt.page_size;
                         compute.enqueue([=, &check_kv] { check_kv(pair, l, pos0); });
                       }
                     });

      // This chunk's K/V: produced in near slots (overwrite: nothing copied in), then home once.
      std::vector<std::int32_t> fresh;
      for (std::int32_t p = first; p < last; ++p) fresh.push_back(cache.page_id(seq, l, p));
      stream_windows(kv, compute, fresh, opt.window, oomb::access::overwrite,
                     [&](std::size_t off, oomb::id_span win, const std::vector<std::int32_t>& slots) {
                       for (std::size_t i = 0; i < win.size(); ++i) {
                         auto* pair = reinterpret_cast<oomb::bf16*>(kv.near_pool().address(slots[i]));
                         const std::int64_t pos0 = std::int64_t(first + static_cast<std::int32_t>(off + i)) * opt.page_size;
                         compute.enqueue([=, &shape] {
                           for (int which = 0; which < 2; ++which)
                             for (std::int32_t h = 0; h < shape.kv_heads; ++h)
                               for (std::int32_t t = 0; t < shape.page_size; ++t)
                                 for (std::int32_t d = 0; d < shape.head_dim; ++d)
                                   pair[which * pe + h * shape.stride_head() + t * shape.stride_token() + d] =
                                       pos0 + t < tokens ? oomb::bf16(kv_value(l, pos0 + t, h, d, which)) : oomb::bf16(0.0f);
                         });
                       }
                     });
      kv.write_back(fresh);
    }
    // Keep the host at most two chunks ahead of the compute stream (the edge of a step).
    step_done[static_cast<std::size_t>(c)] = compute.record();
    if (c >= 2) step_done[static_cast<std::size_t>(c - 2)].wait();
  }
  compute.synchronize();
  kv.drain();
  const auto kv1 = kv.stats();
  std::cout << "stage 1 (forward, " << chunks << " chunks): " << seconds_since(t1) << " s\n";
  print_tier("K/V      ", kv, cache.stats());
  print_traffic("K/V      ", kv1);
  const bool written_once = kv1.bytes_to_far == std::uint64_t(total_pages) * cache.pair_bytes() &&
                            kv1.write_backs == std::uint64_t(total_pages);
  std::cout << "  every K/V page written home exactly once: " << (written_once ? "yes" : "NO") << "\n";

  // ---------------- stage 2: chunks in reverse; gradients accumulate near ----------------
  const auto t2 = std::chrono::steady_clock::now();
  std::vector<std::int32_t> visits(static_cast<std::size_t>(total_pages), 0);
  std::int32_t grad_high = 0;
  for (std::int32_t c = chunks - 1; c >= 0; --c) {
    const auto [first, last] = cache.chunk_pages(seq, c);
    for (std::int32_t l = opt.layers - 1; l >= 0; --l) {
      std::vector<std::int32_t> logical = selection[static_cast<std::size_t>(c)][static_cast<std::size_t>(l)];
      for (std::int32_t p = first; p < last; ++p) logical.push_back(p);
      std::vector<std::int32_t> kv_ids, g_ids;
      for (std::int32_t p : logical) {
        kv_ids.push_back(cache.page_id(seq, l, p));
        g_ids.push_back(grads.touch(kv_ids.back()).grad_id);  // fresh: zero-filled near by gs
      }
      const std::size_t n = kv_ids.size(), step = static_cast<std::size_t>(opt.window);
      auto window = [&](const std::vector<std::int32_t>& v, std::size_t off) {
        return oomb::id_span(v.data() + off, std::min(step, n - off));
      };
      kv.prefetch(window(kv_ids, 0));
      gs.prefetch(window(g_ids, 0));
      for (std::size_t off = 0; off < n; off += step) {
        const auto kwin = window(kv_ids, off), gwin = window(g_ids, off);
        const auto ks = kv.acquire(compute, kwin, oomb::access::read);
        const auto gsl = gs.acquire(compute, gwin, oomb::access::write);
        if (off + step < n) {
          kv.prefetch(window(kv_ids, off + step));
          gs.prefetch(window(g_ids, off + step));
        }
        for (std::size_t i = 0; i < kwin.size(); ++i) {
          const auto* pair = reinterpret_cast<const oomb::bf16*>(kv.near_pool().address(ks[i]));
          auto* g = reinterpret_cast<float*>(gs.near_pool().address(gsl[i]));
          const std::int64_t pos0 = std::int64_t(logical[off + i]) * opt.page_size;
          const float expect = static_cast<float>(++visits[static_cast<std::size_t>(kwin[i])]);
          // "Backward": read K/V, add into the gradient pair (here: 1 per visit, so the value
          // counts the visits and any lost or early write-back shows).
          compute.enqueue([=, &check_kv, &grad_bad, &grad_checked] {
            check_kv(pair, l, pos0);
            for (std::int64_t e = 0; e < 2 * pe; ++e) g[e] += 1.0f;
            if (g[0] != expect || g[2 * pe - 1] != expect) ++grad_bad;
            ++grad_checked;
          });
        }
        kv.release(compute, kwin);
        gs.release(compute, gwin);
        gs.write_back(gwin);
      }
    }
    grad_high = std::max(grad_high, grads.stats().in_use);
    // Chunk c is done: its K/V and gradient pages die (dropped from the schedulers first).
    for (std::int32_t l = 0; l < opt.layers; ++l) kv.discard(cache.page_ids(seq, l, first, last));
    cache.pop_chunk(seq, [&](std::int32_t id) {
      const std::int32_t g = grads.grad_id(id);
      if (g >= 0) {
        gs.discard({g});
        grads.release(id);
      }
    });
    step_done[static_cast<std::size_t>(c)] = compute.record();
    if (c + 2 < chunks) step_done[static_cast<std::size_t>(c + 2)].wait();
  }
  compute.synchronize();
  kv.drain();
  gs.drain();
  const auto kv2 = kv.stats(), g2 = gs.stats();
  std::cout << "stage 2 (backward, chunks in reverse): " << seconds_since(t2) << " s\n";
  print_tier("K/V      ", kv, cache.stats());
  print_tier("gradients", gs, grads.stats());
  std::cout << "  gradient pages alive at most: " << grad_high << " ("
            << mib(double(grad_high) * double(grads.pair_bytes())) << ")\n";
  oomb::residency_stats kv_stage2 = kv2;
  kv_stage2.bytes_to_near -= kv1.bytes_to_near;
  kv_stage2.bytes_to_far -= kv1.bytes_to_far;
  kv_stage2.copies_to_near -= kv1.copies_to_near;
  kv_stage2.copies_to_far -= kv1.copies_to_far;
  kv_stage2.hits -= kv1.hits;
  kv_stage2.misses -= kv1.misses;
  kv_stage2.acquire_misses -= kv1.acquire_misses;
  kv_stage2.evictions -= kv1.evictions;
  kv_stage2.write_backs -= kv1.write_backs;
  kv_stage2.zero_fills -= kv1.zero_fills;
  print_traffic("K/V      ", kv_stage2);
  print_traffic("gradients", g2);

  const bool ok = written_once && kv_bad == 0 && grad_bad == 0 && kv2.write_backs == kv1.write_backs &&
                  cache.stats().in_use == 0 && grads.stats().in_use == 0;
  std::cout << "checked " << kv_checked << " K/V page reads and " << grad_checked
            << " gradient accumulations: " << kv_bad << " K/V mismatches, " << grad_bad
            << " gradient mismatches; K/V written home in stage 2: "
            << mib(double(kv2.bytes_to_far - kv1.bytes_to_far)) << "\n"
            << (ok ? "OK" : "FAILED") << "\n";
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
