// oomb — the host stream: an ordered queue of host work run by one worker thread.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU implementation of the stream concept (oomb/offload/stream.hpp), so every piece of the
// offload logic runs and is tested without a GPU. Copies are memcpy on the worker thread.
//
// Ordering: work runs strictly in the order it was enqueued. record() returns an event that
// completes when everything enqueued before it has run; wait(e) makes work enqueued after it start
// only once e has completed (e may come from another stream: cross-stream ordering). The enqueuing
// thread never blocks, except in synchronize() and host_event::wait().
//
// Errors: an exception thrown by enqueued work is caught on the worker and kept as the stream's
// error. The stream then skips its later work (what follows may depend on what failed, as with a
// CUDA stream's sticky error) and every event recorded after the failure completes *with* the
// error: host_event::wait() rethrows it, and a stream that wait()s on such an event takes the error
// over (and skips its own later work). synchronize() rethrows the error and clears it, after which
// the stream runs work again. An error nobody observed before the stream is destroyed is dropped
// (destructors do not throw).
//
// Thread safety: enqueue_*, record, wait, synchronize and pending may be called from several
// threads at once (work from different threads is ordered by who takes the internal lock first).
// Moving or destroying a stream needs exclusive access. The destructor runs the work still queued,
// then joins the worker, so events handed out earlier always complete.
//
// Testing: host_stream_options::op_delay makes the worker sleep before each work item (a copy, a
// batch, a callable), so tests can prove that readers wait for the events of copies.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "oomb/core/error.hpp"
#include "oomb/offload/stream.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

// Completion state shared by an event and the stream that completes it.
struct host_event_state {
  std::atomic<bool> done{false};
  std::exception_ptr error;  // written before `done` is set, read only after it is seen set
  std::mutex m;
  std::condition_variable cv;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(m);
      error = std::move(e);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  void block_until_done() {
    if (done.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return done.load(std::memory_order_acquire); });
  }
};

// A move-only type-erased `void()`: enqueue() accepts move-only callables too.
class host_task_fn {
 public:
  host_task_fn() = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, host_task_fn>>>
  explicit host_task_fn(F&& f) : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  void operator()() { impl_->call(); }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual void call() = 0;
  };
  template <class F>
  struct model final : concept_t {
    explicit model(F&& f) : fn(std::move(f)) {}
    explicit model(const F& f) : fn(f) {}
    void call() override { fn(); }
    F fn;
  };
  std::unique_ptr<concept_t> impl_;
};

}  // namespace detail

/// Completion of the work a host_stream had enqueued when record() was called. Copyable (shared
/// state). A default-constructed event is already complete.
class host_event {
 public:
  host_event() = default;

  /// Non-blocking: true once the recorded work has run (or failed).
  bool ready() const noexcept { return !state_ || state_->done.load(std::memory_order_acquire); }

  /// Blocks the calling thread until ready(); rethrows the stream's error if the work before the
  /// event failed. For the edges of a step, never its middle.
  void wait() const {
    if (!state_) return;
    state_->block_until_done();
    if (state_->error) std::rethrow_exception(state_->error);
  }

  /// True when the event is complete and carries an error (wait() would throw).
  bool failed() const noexcept { return ready() && state_ && state_->error != nullptr; }

 private:
  friend class host_stream;
  explicit host_event(std::shared_ptr<detail::host_event_state> s) noexcept : state_(std::move(s)) {}
  std::shared_ptr<detail::host_event_state> state_;
};

static_assert(is_event_v<host_event>);

/// Construction options of a host_stream.
struct host_stream_options {
  /// Sleep before each work item (copy, batch, callable). Zero in real use; tests set it to make a
  /// stream deliberately slow, so that a reader that skipped an event wait sees stale data.
  std::chrono::microseconds op_delay{0};
};

/// Owner of one worker thread running enqueued work strictly in order. Movable, not copyable.
class host_stream {
 public:
  using event_type = host_event;

  host_stream() : host_stream(host_stream_options{}) {}
  explicit host_stream(host_stream_options options) : state_(std::make_unique<state>(options)) {
    state_->worker = std::thread([s = state_.get()] { s->run(); });
  }

  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  host_stream(host_stream&&) noexcept = default;
  host_stream& operator=(host_stream&& o) noexcept {
    if (this != &o) {
      shutdown();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  /// Runs the work still queued, then joins the worker.
  ~host_stream() { shutdown(); }

  /// memcpy(dst, src, bytes) on the worker. The ranges must not overlap; both must stay valid until
  /// the work has run. Throws invalid_argument for a null pointer with bytes > 0 or overlapping ranges.
  void enqueue_copy(void* dst, const void* src, std::size_t bytes) {
    check_copy(dst, src, bytes, 0);
    if (bytes == 0) return;
    push(detail::host_task_fn([dst, src, bytes] { std::memcpy(dst, src, bytes); }));
  }

  /// One work item running every copy of the batch (in the given order; the concept allows any).
  /// The array is copied now; the memory it names must stay valid until the work has run.
  void enqueue_copies(const copy_op* ops, std::size_t count) {
    OOMB_EXPECTS(ops != nullptr || count == 0, "host_stream: null batch of ", count, " copies");
    std::vector<copy_op> batch;
    batch.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      check_copy(ops[i].dst, ops[i].src, ops[i].bytes, i);
      if (ops[i].bytes != 0) batch.push_back(ops[i]);
    }
    if (batch.empty()) return;
    push(detail::host_task_fn([b = std::move(batch)] {
      for (const copy_op& op : b) std::memcpy(op.dst, op.src, op.bytes);
    }));
  }

  /// Runs `f()` on the worker, in order with everything else. An exception it throws becomes the
  /// stream's error (see the file comment).
  template <class F>
  void enqueue(F&& f) {
    static_assert(std::is_invocable_v<std::decay_t<F>&>, "host_stream::enqueue needs a callable f()");
    push(detail::host_task_fn(std::forward<F>(f)));
  }

  /// An event completing once everything enqueued so far has run.
  host_event record() {
    auto ev = std::make_shared<detail::host_event_state>();
    task t;
    t.kind = task_kind::signal;
    t.event = ev;
    live().push(std::move(t));
    return host_event(std::move(ev));
  }

  /// Work enqueued after this call starts only once `e` has completed. Never blocks the caller.
  void wait(const host_event& e) {
    state& s = live();
    if (!e.state_ || (e.ready() && !e.state_->error)) return;  // nothing to wait for
    task t;
    t.kind = task_kind::await;
    t.event = e.state_;
    s.push(std::move(t));
  }

  /// Blocks until everything enqueued so far has run; rethrows the stream's error, if any, and
  /// clears it so the stream runs work again.
  void synchronize() {
    host_event done = record();
    done.state_->block_until_done();
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(state_->m);
      e = std::exchange(state_->error, nullptr);
    }
    if (e) std::rethrow_exception(e);
  }

  /// Work items, events and waits queued or running (a snapshot).
  std::size_t pending() const {
    const state& s = live();
    std::lock_guard<std::mutex> lock(s.m);
    return s.queue.size() + (s.running ? 1 : 0);
  }

  const host_stream_options& options() const { return live().options; }

 private:
  enum class task_kind : unsigned char { work, signal, await };
  struct task {
    task_kind kind = task_kind::work;
    detail::host_task_fn fn;
    std::shared_ptr<detail::host_event_state> event;
  };

  struct state {
    explicit state(host_stream_options o) : options(o) {}

    void push(task&& t) {
      {
        std::lock_guard<std::mutex> lock(m);
        queue.push_back(std::move(t));
      }
      cv.notify_one();
    }

    void run() {
      for (;;) {
        task t;
        std::exception_ptr err;
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [this] { return stopping || !queue.empty(); });
          if (queue.empty()) return;  // stopping, and everything has run
          t = std::move(queue.front());
          queue.pop_front();
          running = true;
          err = error;
        }
        std::exception_ptr raised;
        switch (t.kind) {
          case task_kind::work:
            if (!err) {  // after a failure, later work is skipped
              if (options.op_delay.count() > 0) std::this_thread::sleep_for(options.op_delay);
              try {
                t.fn();
              } catch (...) {
                raised = std::current_exception();
              }
            }
            break;
          case task_kind::signal:
            break;  // completed below, once this item no longer counts as pending
          case task_kind::await:
            t.event->block_until_done();
            raised = t.event->error;  // the awaited work failed: so does what depends on it
            break;
        }
        {
          std::lock_guard<std::mutex> lock(m);
          if (raised && !error) error = raised;
          running = false;
        }
        if (t.kind == task_kind::signal) t.event->complete(err);
      }
    }

    host_stream_options options;
    mutable std::mutex m;
    std::condition_variable cv;
    std::deque<task> queue;
    std::exception_ptr error;  // the first failure not yet cleared by synchronize()
    bool running = false;
    bool stopping = false;
    std::thread worker;
  };

  state& live() const {
    OOMB_EXPECTS(state_ != nullptr, "host_stream: use of a moved-from stream");
    return *state_;
  }

  void push(detail::host_task_fn&& fn) {
    state& s = live();
    task t;
    t.kind = task_kind::work;
    t.fn = std::move(fn);
    s.push(std::move(t));
  }

  static void check_copy(void* dst, const void* src, std::size_t bytes, std::size_t index) {
    if (bytes == 0) return;
    OOMB_EXPECTS(dst != nullptr && src != nullptr, "host_stream: copy ", index, " of ", bytes,
                 " bytes has a null ", dst == nullptr ? "destination" : "source");
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const auto s = reinterpret_cast<std::uintptr_t>(src);
    OOMB_EXPECTS(d + bytes <= s || s + bytes <= d, "host_stream: copy ", index, " of ", bytes,
                 " bytes has overlapping source and destination (", src, " -> ", dst, ")");
  }

  void shutdown() noexcept {
    if (!state_) return;
    {
      std::lock_guard<std::mutex> lock(state_->m);
      state_->stopping = true;
    }
    state_->cv.notify_one();
    if (state_->worker.joinable()) state_->worker.join();
    state_.reset();
  }

  std::unique_ptr<state> state_;
};

static_assert(is_stream_v<host_stream>);

OOMB_NAMESPACE_END
