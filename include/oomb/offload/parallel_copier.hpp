// oomb — host memory copies split over a fixed set of threads.
// SPDX-License-Identifier: Apache-2.0
//
// One thread moves ~6-12 GB/s between large host buffers; the PCIe link a staged page transfer
// feeds moves ~55 GB/s per direction (cuda/staged_page_transfer.cuh). parallel_copier splits one
// list of copies into equal byte shares, one per thread: the caller's thread takes the first share
// and `threads - 1` workers the others, and copy() returns once every byte has landed. Several
// callers may copy at once (from different threads): their shares queue in arrival order and each
// caller waits only for its own. A list smaller than min_split_bytes is copied by the caller alone.
// Copies must not overlap each other. copy() never throws (it runs inside CUDA host functions): a
// share the queue has no memory for is copied by the caller. Every share ends with a full fence, so
// the bytes are visible to other threads and devices before anything the caller writes after copy().
// shared() is the process's copier, one thread per hardware thread: transfers that share it ask the
// host for no more copying threads than it has, however many of them run at once (a copier per
// transfer multiplies its threads by the transfers: 6 x 8 on a 16-core host for the trainer).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

/// Copies lists of byte ranges with `threads` threads (the caller's included). See the file comment.
class parallel_copier {
 public:
  /// Lists under this many bytes are copied by the calling thread alone (a wake-up costs more).
  static constexpr std::size_t min_split_bytes = std::size_t(1) << 20;

  /// Starts `threads - 1` workers. Throws invalid_argument for threads < 1 (or > 256).
  explicit parallel_copier(int threads) : threads_(threads) {
    OOMB_EXPECTS(threads >= 1 && threads <= 256, "parallel_copier: threads must be in [1, 256], got ", threads);
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    try {
      for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  parallel_copier(const parallel_copier&) = delete;
  parallel_copier& operator=(const parallel_copier&) = delete;
  /// Joins the workers (copies in progress finish first).
  ~parallel_copier() { stop(); }

  int threads() const noexcept { return threads_; }

  /// One thread per hardware thread (std::thread::hardware_concurrency; 1 where it reports none),
  /// at most 256.
  static int default_threads() noexcept {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(std::min(n, 256u));
  }

  /// The process's shared copier, default_threads() threads, started on first use (thread-safe) and
  /// joined at exit, after every object whose construction called it.
  static parallel_copier& shared() {
    static parallel_copier copier(default_threads());
    return copier;
  }

  /// Copies ops[0, count) and returns when all of it has landed. Thread-safe.
  void copy(const copy_op* ops, std::size_t count) noexcept {
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) total += ops[i].bytes;
    if (total == 0) return;
    const std::size_t parts = total < min_split_bytes ? 1 : static_cast<std::size_t>(threads_);
    // Shares of whole cache lines, so no two threads write one line.
    const std::size_t share = ((total + parts - 1) / parts + 63) & ~std::size_t(63);
    latch done;
    share_task mine{};
    std::size_t op = 0, offset = 0, left = total;
    for (std::size_t p = 0; p < parts && left > 0; ++p) {
      const share_task t{ops, count, op, offset, std::min(share, left), &done};
      advance(ops, op, offset, t.bytes);
      left -= t.bytes;
      if (p == 0) {
        mine = t;
        continue;
      }
      bool queued = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        try {
          queue_.push_back(t);
          ++done.pending;
          queued = true;
        } catch (...) {  // no memory for the queue: this thread copies the share itself
        }
      }
      if (queued) wake_.notify_one();
      else run(t);
    }
    run(mine);
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return done.pending == 0; });
  }

 private:
  struct latch {
    std::size_t pending = 0;  // shares queued for workers and not yet done (under mutex_)
  };
  struct share_task {
    const copy_op* ops;
    std::size_t count;
    std::size_t op, offset, bytes;  // from byte `offset` of ops[op], `bytes` bytes
    latch* done;
  };

  // Moves (op, offset) forward by `bytes` bytes of the list.
  static void advance(const copy_op* ops, std::size_t& op, std::size_t& offset, std::size_t bytes) noexcept {
    while (bytes > 0) {
      const std::size_t here = std::min(bytes, ops[op].bytes - offset);
      bytes -= here;
      offset += here;
      if (offset == ops[op].bytes) {
        ++op;
        offset = 0;
      }
    }
  }

  static void run(const share_task& t) noexcept {
    std::size_t op = t.op, offset = t.offset, left = t.bytes;
    while (left > 0) {
      const copy_op& o = t.ops[op];
      const std::size_t here = std::min(left, o.bytes - offset);
      std::memcpy(static_cast<std::byte*>(o.dst) + offset, static_cast<const std::byte*>(o.src) + offset, here);
      left -= here;
      offset = 0;
      ++op;
    }
    // memcpy writes large copies with non-temporal stores, which are weakly ordered: fence them, so
    // whatever the caller publishes after copy() (a flag a DMA engine polls) orders after them.
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  void work() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const share_task t = queue_.front();
      queue_.pop_front();
      lock.unlock();
      run(t);
      lock.lock();
      if (--t.done->pending == 0) finished_.notify_all();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_)
      if (w.joinable()) w.join();
  }

  int threads_;
  std::mutex mutex_;
  std::condition_variable wake_;      // workers: a share was queued, or stop
  std::condition_variable finished_;  // callers: a share of theirs is done
  std::deque<share_task> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

OOMB_NAMESPACE_END
