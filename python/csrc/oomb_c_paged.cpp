// oomb_c.h's paged session (v4): the trainer's paged attention over its CPU backend (paged_session.hpp).
// SPDX-License-Identifier: Apache-2.0
#include <cstdint>
#include <memory>
#include <vector>

#include "c_abi_errors.hpp"
#include "oomb_c.h"
#include "paged_session.hpp"
#include "trainer/cpu/cpu_ops.hpp"

namespace {

using oomb_c_abi::guarded;
namespace trainer = oomb_trainer;

/// The session's interface over its element type (float or double pages and arithmetic).
struct cpu_session {
  virtual ~cpu_session() = default;
  virtual void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) = 0;
  virtual void append(std::int64_t n) = 0;
  virtual void write(std::int32_t l, std::int32_t c, std::int64_t n, const void* k, const void* v) = 0;
  virtual void select(std::int32_t l, std::int32_t c, std::int64_t n, const void* q) = 0;
  virtual void expect_recompute(std::int32_t c) = 0;
  virtual void forward(std::int32_t l, std::int32_t c, std::int64_t n, const void* q, void* o, void* lse) = 0;
  virtual void backward(std::int32_t l, std::int32_t c, std::int64_t n, const void* q, const void* o, const void* lse,
                        const void* d_o, void* dq, void* dk, void* dv) = 0;
  virtual void release_chunk(std::int32_t c) = 0;
  virtual const oomb::sparse_page_table& selection(std::int32_t l, std::int32_t c) const = 0;
  virtual oomb_paged_stats end_step() = 0;
};

template <class T>
class cpu_session_of final : public cpu_session {
 public:
  cpu_session_of(const trainer::model_config& cfg, const trainer::chunk_options& opt, std::int64_t max_tokens)
      : s_(cfg, opt, max_tokens) {}

  void begin_step(std::int32_t chunks, const std::vector<std::int32_t>& doc_starts) override {
    s_.begin_step(chunks, doc_starts);
  }
  void append(std::int64_t n) override { s_.append(n); }
  void write(std::int32_t l, std::int32_t c, std::int64_t n, const void* k, const void* v) override {
    s_.write(l, c, n, in(k, "k"), in(v, "v"));
  }
  void select(std::int32_t l, std::int32_t c, std::int64_t n, const void* q) override { s_.select(l, c, n, in(q, "q")); }
  void expect_recompute(std::int32_t c) override { s_.expect_recompute(c); }
  void forward(std::int32_t l, std::int32_t c, std::int64_t n, const void* q, void* o, void* lse) override {
    s_.forward(l, c, n, in(q, "q"), out(o, "o"), out(lse, "lse"));
  }
  void backward(std::int32_t l, std::int32_t c, std::int64_t n, const void* q, const void* o, const void* lse,
                const void* d_o, void* dq, void* dk, void* dv) override {
    s_.backward(l, c, n, in(q, "q"), in(o, "o"), in(lse, "lse"), in(d_o, "d_o"), out(dq, "dq"), out(dk, "dk"),
                out(dv, "dv"));
  }
  void release_chunk(std::int32_t c) override { s_.release_chunk(c); }
  const oomb::sparse_page_table& selection(std::int32_t l, std::int32_t c) const override { return s_.selection(l, c); }
  oomb_paged_stats end_step() override { return s_.end_step(); }

 private:
  static const T* in(const void* p, const char* what) {
    OOMB_PAGED_EXPECTS(p != nullptr, "null ", what);
    return static_cast<const T*>(p);
  }
  static T* out(void* p, const char* what) {
    OOMB_PAGED_EXPECTS(p != nullptr, "null ", what);
    return static_cast<T*>(p);
  }

  oomb_c_abi::paged_session<trainer::cpu_ops<T>> s_;
};

std::unique_ptr<cpu_session> make_session(const oomb_paged_config& c) {
  OOMB_PAGED_EXPECTS(c.struct_size >= static_cast<std::int32_t>(sizeof(oomb_paged_config)), "oomb_paged_config of ",
                     c.struct_size, " bytes, this library needs ", sizeof(oomb_paged_config));
  OOMB_PAGED_EXPECTS(c.dtype == OOMB_DTYPE_F32 || c.dtype == OOMB_DTYPE_F64, "dtype ", c.dtype,
                     " is not one of the CPU path's (0: float32, 1: float64)");
  auto [cfg, o] = oomb_c_abi::session_setup(c);
  o.validate();
  if (c.dtype == OOMB_DTYPE_F64) return std::make_unique<cpu_session_of<double>>(cfg, o, c.max_tokens);
  return std::make_unique<cpu_session_of<float>>(cfg, o, c.max_tokens);
}

}  // namespace

struct oomb_paged {
  std::unique_ptr<cpu_session> session;
};

namespace {
cpu_session& session_of(oomb_paged* s) {
  OOMB_PAGED_EXPECTS(s != nullptr && s->session, "null session");
  return *s->session;
}
}  // namespace

extern "C" {

int oomb_paged_create(const oomb_paged_config* config, oomb_paged** out) {
  return guarded([&] {
    OOMB_PAGED_EXPECTS(config != nullptr && out != nullptr, "null argument");
    *out = nullptr;
    auto s = std::make_unique<oomb_paged>();
    s->session = make_session(*config);
    *out = s.release();
  });
}

void oomb_paged_destroy(oomb_paged* s) { delete s; }

int oomb_paged_begin_step(oomb_paged* s, int32_t chunks, const int32_t* doc_starts, int32_t docs) {
  return guarded([&] {
    OOMB_PAGED_EXPECTS(docs >= 0 && (docs == 0 || doc_starts != nullptr), "bad documents: ", docs);
    session_of(s).begin_step(chunks, std::vector<std::int32_t>(doc_starts, doc_starts + docs));
  });
}

int oomb_paged_append(oomb_paged* s, int64_t tokens) {
  return guarded([&] { session_of(s).append(tokens); });
}

int oomb_paged_write(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* k, const void* v) {
  return guarded([&] { session_of(s).write(layer, chunk, n, k, v); });
}

int oomb_paged_select(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q) {
  return guarded([&] { session_of(s).select(layer, chunk, n, q); });
}

int oomb_paged_expect_recompute(oomb_paged* s, int32_t chunk) {
  return guarded([&] { session_of(s).expect_recompute(chunk); });
}

int oomb_paged_forward(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, void* o, void* lse) {
  return guarded([&] { session_of(s).forward(layer, chunk, n, q, o, lse); });
}

int oomb_paged_backward(oomb_paged* s, int32_t layer, int32_t chunk, int64_t n, const void* q, const void* o,
                        const void* lse, const void* d_o, void* dq, void* dk, void* dv) {
  return guarded([&] { session_of(s).backward(layer, chunk, n, q, o, lse, d_o, dq, dk, dv); });
}

int oomb_paged_release_chunk(oomb_paged* s, int32_t chunk) {
  return guarded([&] { session_of(s).release_chunk(chunk); });
}

int oomb_paged_selection(oomb_paged* s, int32_t layer, int32_t chunk, int32_t* indptr, int64_t indptr_capacity,
                         int32_t* pages, int64_t pages_capacity, int64_t* tiles, int64_t* entries) {
  return guarded([&] {
    OOMB_PAGED_EXPECTS(tiles != nullptr && entries != nullptr, "null size outputs");
    oomb_c_abi::copy_selection(session_of(s).selection(layer, chunk), indptr, indptr_capacity, pages, pages_capacity,
                               tiles, entries);
  });
}

int oomb_paged_end_step(oomb_paged* s, oomb_paged_stats* stats) {
  return guarded([&] {
    OOMB_PAGED_EXPECTS(stats != nullptr, "null stats");
    *stats = session_of(s).end_step();
  });
}

}  // extern "C"
