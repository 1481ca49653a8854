// Pageable homes on the GPU: page batches between pageable host memory and the device through pinned
// staging (cuda_staged_page_transfer), against the same batches from pinned homes by the copy
// engines (cuda_page_transfer), and the device memory each kind of home costs. A plain program
// writing one JSON line per measurement.
// SPDX-License-Identifier: Apache-2.0
//
//   staged_transfer_bench [--quick] [--tiers-only] [--gib N] [--jsonl FILE]
//
// Homes: an N-GiB pool (pinned or pageable, every page written once first, so no first touch is
// timed); slots: a 1-GiB device pool. A batch moves 512 MiB of distinct random homes to random slots
// (to the device), the reverse (to the homes), or one of each at once on two streams ("both":
// the bytes of both counted). Bandwidth = bytes / time between CUDA events around 4 back-to-back
// batches after a warm-up batch; the median of 3 trials. Staged runs sweep the copy threads (one
// copier for both directions: "both" rows before 2026-12-06 had a copier per direction) and
// the chunk size. "mapping" rows: the device memory (cudaMemGetInfo) taken by pinning the homes.
// "tiers" rows: the trainer's case, three tiers of pageable homes (K/V, gradient and kept-output
// pages of the 7B: 256, 512 and 256 KiB) each moving a batch both ways at once, enqueued from three
// threads, so six staged transfers copy at the same time: with a copier of 8 threads per transfer
// (before the shared copier) and with the process's shared copier (a thread per hardware thread);
// the rate counts the bytes of all six.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "oomb/cuda/device_resource.hpp"
#include "oomb/cuda/error.hpp"
#include "oomb/cuda/event.hpp"
#include "oomb/cuda/page_transfer.cuh"
#include "oomb/cuda/pinned_resource.hpp"
#include "oomb/cuda/staged_page_transfer.cuh"
#include "oomb/cuda/stream.hpp"
#include "oomb/memory/block_pool.hpp"
#include "oomb/memory/host_resource.hpp"

namespace {

constexpr std::size_t mib = std::size_t(1) << 20;
constexpr std::size_t batch_bytes = 512 * mib;

std::size_t device_used() {
  std::size_t free = 0, total = 0;
  OOMB_CUDA_CHECK(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

std::vector<std::int32_t> random_ids(std::int32_t capacity, std::size_t n, std::mt19937& rng) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// One kind of home: its pool and the transfers both ways (Up: slots <- homes, Down: homes <- slots).
template <class Home, class Up, class Down>
struct rig {
  rig(Home& home_memory, oomb::device_resource& dr, std::size_t page_bytes, std::size_t home_bytes,
      oomb::cuda_transfer_options o)
      : homes(oomb::block_pool<Home>::contiguous(home_memory, page_bytes, std::int32_t(home_bytes / page_bytes))),
        slots(oomb::block_pool<oomb::device_resource>::contiguous(dr, page_bytes, std::int32_t((1024 * mib) / page_bytes))),
        up(slots, homes, o),
        down(homes, slots, o) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(homes.capacity()));
    homes.acquire(homes.capacity(), ids.data());
    for (std::int32_t id : ids) std::memset(homes.address(id), id & 0xff, page_bytes);  // touched once
    std::vector<std::int32_t> s(static_cast<std::size_t>(slots.capacity()));
    slots.acquire(slots.capacity(), s.data());
  }
  oomb::block_pool<Home> homes;
  oomb::block_pool<oomb::device_resource> slots;
  Up up;
  Down down;
};

template <class Rig>
double measure(Rig& r, const std::string& direction, std::mt19937& rng) {
  const std::size_t pages = batch_bytes / r.homes.block_bytes();
  oomb::cuda_stream in(oomb::cuda_stream::greatest_priority()), out(oomb::cuda_stream::greatest_priority());
  oomb::cuda_event start(oomb::cuda_event::timing), stop(oomb::cuda_event::timing);
  auto batch = [&] {
    const auto h = random_ids(r.homes.capacity(), pages, rng), s = random_ids(r.slots.capacity(), pages, rng);
    if (direction != "to_homes") r.up.enqueue(in, s, h);
    if (direction != "to_device") {
      const auto h2 = random_ids(r.homes.capacity(), pages, rng), s2 = random_ids(r.slots.capacity(), pages, rng);
      r.down.enqueue(out, h2, s2);
    }
  };
  std::vector<double> rates;
  for (int trial = 0; trial < 3; ++trial) {
    batch();  // warm-up
    in.wait(out.record());
    in.record(start);
    out.wait(start);
    const int reps = 4;
    for (int k = 0; k < reps; ++k) batch();
    in.wait(out.record());
    in.record(stop);
    stop.wait();
    const double s = double(oomb::elapsed_ms(start, stop)) / 1e3;
    const double bytes = double(batch_bytes) * reps * (direction == "both" ? 2 : 1);
    rates.push_back(bytes / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[1];
}

// `rounds` batches each way on r's transfers, on two streams of their own; returns once all landed.
template <class Rig>
void both_ways(Rig& r, std::mt19937& rng, int rounds) {
  const std::size_t pages = batch_bytes / r.homes.block_bytes();
  oomb::cuda_stream in(oomb::cuda_stream::greatest_priority()), out(oomb::cuda_stream::greatest_priority());
  for (int k = 0; k < rounds; ++k) {
    r.up.enqueue(in, random_ids(r.slots.capacity(), pages, rng), random_ids(r.homes.capacity(), pages, rng));
    r.down.enqueue(out, random_ids(r.homes.capacity(), pages, rng), random_ids(r.slots.capacity(), pages, rng));
  }
  in.synchronize();
  out.synchronize();
}

// Three pageable tiers moving both ways at once from three threads (see the file comment): GB/s of
// all six transfers, the median of 3 trials of 4 rounds after a warm-up round.
double measure_tiers(oomb::device_resource& dr, std::size_t home_bytes, const oomb::cuda_transfer_options& o) {
  using staged_rig = rig<oomb::host_resource, oomb::cuda_staged_page_transfer<oomb::device_resource, oomb::host_resource>,
                         oomb::cuda_staged_page_transfer<oomb::host_resource, oomb::device_resource>>;
  oomb::host_resource hr;
  const std::size_t pages[3] = {256 << 10, 512 << 10, 256 << 10};
  std::vector<std::unique_ptr<oomb::parallel_copier>> own_copiers;  // outlive the rigs (declared first)
  std::vector<std::unique_ptr<staged_rig>> rigs;
  for (std::size_t p : pages) {
    oomb::cuda_transfer_options own = o;
    if (o.pageable.copier == nullptr) {  // the old default: a copier of 8 threads per transfer
      own_copiers.push_back(std::make_unique<oomb::parallel_copier>(8));
      own.pageable.copier = own_copiers.back().get();
    }
    rigs.push_back(std::make_unique<staged_rig>(hr, dr, p, home_bytes, own));
  }
  auto all_tiers = [&](int trial, int rounds) {
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < rigs.size(); ++t)
      threads.emplace_back([&, t] {
        std::mt19937 rng(std::uint32_t(100 * trial + int(t)));
        both_ways(*rigs[t], rng, rounds);
      });
    for (std::thread& th : threads) th.join();
  };
  std::vector<double> rates;
  for (int trial = 0; trial < 3; ++trial) {
    all_tiers(trial, 1);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    all_tiers(trial, 4);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(batch_bytes) * 2 * 4 * 3 / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[1];
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false, tiers_only = false;
  std::size_t gib = 2;
  std::string jsonl;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--tiers-only") tiers_only = true;
    else if (a == "--gib" && i + 1 < argc) gib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--jsonl" && i + 1 < argc) jsonl = argv[++i];
    else {
      std::fprintf(stderr, "usage: staged_transfer_bench [--quick] [--tiers-only] [--gib N] [--jsonl FILE]\n");
      return 2;
    }
  }
  std::ofstream file;
  if (!jsonl.empty()) file.open(jsonl);
  auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (file) file << line << "\n";
  };
  OOMB_CUDA_CHECK(cudaSetDevice(0), "a CUDA GPU");
  OOMB_CUDA_CHECK(cudaFree(nullptr), "creating the context");
  const std::size_t home_bytes = gib << 30;
  oomb::device_resource dr;
  std::mt19937 rng(7);
  // Pages of Qwen2.5-7B and -0.5B at 128 tokens: a bf16 K/V pair (256 / 64 KiB), an fp32 gradient pair.
  const std::vector<std::size_t> page_sizes = quick ? std::vector<std::size_t>{256 << 10}
                                                    : std::vector<std::size_t>{64 << 10, 256 << 10, 512 << 10};
  const std::vector<std::string> directions = {"to_device", "to_homes", "both"};
  // Six transfers at once: a copier of 8 threads each (48 in all), then one shared copier of 8, of
  // one thread per hardware thread (the default), and of twice that.
  const int hw = oomb::parallel_copier::default_threads();
  for (const int shared : {0, 8, hw, 2 * hw}) {
    std::unique_ptr<oomb::parallel_copier> mine;
    oomb::cuda_transfer_options o;
    if (shared == hw) o.pageable.copier = &oomb::parallel_copier::shared();
    else if (shared > 0) o.pageable.copier = (mine = std::make_unique<oomb::parallel_copier>(shared)).get();
    emit("{\"kind\":\"tiers\",\"homes\":\"pageable\",\"copier\":\"" + std::string(shared > 0 ? "shared" : "per_transfer") +
         "\",\"threads\":" + std::to_string(shared > 0 ? shared : 6 * 8) + ",\"hardware_threads\":" + std::to_string(hw) +
         ",\"gb_per_s\":" + std::to_string(measure_tiers(dr, std::min<std::size_t>(home_bytes, std::size_t(1) << 30), o)) + "}");
  }
  for (const std::size_t page : tiers_only ? std::vector<std::size_t>{} : page_sizes) {
    {
      oomb::pinned_resource pr;
      const std::size_t before = device_used();
      oomb::cuda_transfer_options o;
      o.path = oomb::transfer_path::memcpy_batch;
      rig<oomb::pinned_resource, oomb::cuda_page_transfer<oomb::device_resource, oomb::pinned_resource>,
          oomb::cuda_page_transfer<oomb::pinned_resource, oomb::device_resource>>
          r(pr, dr, page, home_bytes, o);
      const double mapping = double(device_used() - before) - 1024.0 * mib;  // less the slots
      emit("{\"kind\":\"mapping\",\"homes\":\"pinned\",\"home_bytes\":" + std::to_string(home_bytes) +
           ",\"device_bytes\":" + std::to_string(mapping) + ",\"page_bytes\":" + std::to_string(page) + "}");
      for (const auto& d : directions)
        emit("{\"kind\":\"rate\",\"homes\":\"pinned\",\"page_bytes\":" + std::to_string(page) + ",\"direction\":\"" + d +
             "\",\"gb_per_s\":" + std::to_string(measure(r, d, rng)) + "}");
    }
    const std::vector<int> threads = quick ? std::vector<int>{4} : std::vector<int>{1, 2, 4, 8};
    const std::vector<std::size_t> chunks = quick ? std::vector<std::size_t>{8 * mib} : std::vector<std::size_t>{4 * mib, 8 * mib, 16 * mib};
    for (const int t : threads)
      for (const std::size_t c : chunks) {
        if (t != 4 && c != 8 * mib) continue;  // threads swept at 8 MiB, chunks at 4 threads
        oomb::host_resource hr;
        oomb::cuda_transfer_options o;
        oomb::parallel_copier copier(t);
        o.pageable.copier = &copier;
        o.pageable.chunk_bytes = c;
        const std::size_t before = device_used();
        rig<oomb::host_resource, oomb::cuda_staged_page_transfer<oomb::device_resource, oomb::host_resource>,
            oomb::cuda_staged_page_transfer<oomb::host_resource, oomb::device_resource>>
            r(hr, dr, page, home_bytes, o);
        const double mapping = double(device_used() - before) - 1024.0 * mib;
        if (t == 4 && c == 8 * mib)
          emit("{\"kind\":\"mapping\",\"homes\":\"pageable\",\"home_bytes\":" + std::to_string(home_bytes) +
               ",\"device_bytes\":" + std::to_string(mapping) + ",\"page_bytes\":" + std::to_string(page) + "}");
        for (const auto& d : directions)
          emit("{\"kind\":\"rate\",\"homes\":\"pageable\",\"page_bytes\":" + std::to_string(page) + ",\"direction\":\"" + d +
               "\",\"threads\":" + std::to_string(t) + ",\"chunk_bytes\":" + std::to_string(c) +
               ",\"gb_per_s\":" + std::to_string(measure(r, d, rng)) + "}");
      }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "staged_transfer_bench: %s\n", e.what());
  return 1;
}
