// oomb — tensors in and out through DLPack (DLTensor / DLManagedTensor), the exchange format of
// PyTorch, JAX, CuPy and NumPy. Opt-in: nothing else in oomb includes this header.
// SPDX-License-Identifier: Apache-2.0
//
// oomb ships no dlpack.h: this header uses the one the program already has. Include yours first
// (PyTorch's <ATen/dlpack.h>, for instance), or define OOMB_DLPACK_HEADER to its name, e.g.
// -DOOMB_DLPACK_HEADER='<ATen/dlpack.h>'; otherwise <dlpack/dlpack.h> is included (Debian's
// libdlpack-dev, DLPack's own install). Any DLPack from 0.6 on works (DLTensor and
// DLManagedTensor are unchanged since).
//
// In: view_of(DLTensor) -> any_tensor_view (dtype and rank at run time), or view_of<E, Rank>
// -> tensor_view<E, Rank>, checked at run time (dtype, rank, one lane, a supported device,
// alignment) with errors naming both sides. Non-owning: the producer's tensor (and for a
// DLManagedTensor, its deleter) stays the caller's business; the view dangles once it is freed.
// Out: to_dlpack(view, on_release, context) -> a DLManagedTensor* the consumer owns: its deleter
// frees what oomb allocated and then calls on_release(context), so the caller learns when the
// consumer is done with the memory (the memory itself is never freed by oomb).
#pragma once

#if !defined(DLPACK_DLPACK_H_)  // dlpack.h's include guard, the same in every version
#if defined(OOMB_DLPACK_HEADER)
#include OOMB_DLPACK_HEADER
#else
#include <dlpack/dlpack.h>
#endif
#endif

#include <cstddef>
#include <cstdint>
#include <new>

#include "oomb/core/any_tensor_view.hpp"
#include "oomb/core/dtype.hpp"
#include "oomb/core/error.hpp"
#include "oomb/core/memory_kind.hpp"
#include "oomb/core/tensor.hpp"

OOMB_NAMESPACE_BEGIN

namespace detail {

inline memory_kind dlpack_memory_kind(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return memory_kind::host;
    case kDLCUDAHost: return memory_kind::pinned;
    case kDLCUDAManaged: return memory_kind::pinned;  // reachable from host and device, as pinned is
    case kDLCUDA: return memory_kind::device;
    default: break;
  }
  OOMB_FAIL(invalid_argument, "dlpack: tensors on DLPack device type ", int(d.device_type),
            " are not supported (CPU, CUDA, CUDA host and CUDA managed memory are)");
}

inline DLDevice dlpack_device(memory_kind k, std::int32_t device) noexcept {
  DLDevice d{};
  d.device_type = k == memory_kind::host ? kDLCPU : k == memory_kind::pinned ? kDLCUDAHost : kDLCUDA;
  d.device_id = k == memory_kind::host ? 0 : device;
  return d;
}

/// What a DLManagedTensor made by to_dlpack points to: the tensor, its shape and strides, and the
/// caller's release hook.
struct dlpack_export {
  DLManagedTensor managed;
  std::int64_t shape[any_tensor_view::max_rank];
  std::int64_t strides[any_tensor_view::max_rank];
  void (*on_release)(void*);
  void* context;
};

// Not extern "C": a C name would ignore OOMB_NAMESPACE and clash between vendored copies.
inline void dlpack_export_deleter(DLManagedTensor* self) {
  auto* e = static_cast<dlpack_export*>(self->manager_ctx);
  void (*on_release)(void*) = e->on_release;
  void* context = e->context;
  delete e;
  if (on_release != nullptr) on_release(context);
}

}  // namespace detail

/// The untyped view of a DLTensor (see the file comment). Strides of nullptr mean row-major;
/// byte_offset is applied. Throws invalid_argument for more than one lane, a dtype code oomb does
/// not name, an unsupported device, a rank above any_tensor_view::max_rank or a negative extent.
inline any_tensor_view view_of(const DLTensor& t) {
  OOMB_EXPECTS(t.dtype.lanes == 1, "dlpack: tensors of ", int(t.dtype.lanes), "-lane vectors are not supported");
  const int code = int(t.dtype.code);
  OOMB_EXPECTS(code == kDLInt || code == kDLUInt || code == kDLFloat || code == kDLBfloat,
               "dlpack: dtype code ", code, " is not supported (int, uint, float and bfloat are)");
  const memory_kind kind = detail::dlpack_memory_kind(t.device);
  OOMB_EXPECTS(t.ndim >= 0 && t.ndim <= any_tensor_view::max_rank, "dlpack: a tensor of ", t.ndim,
               " dimensions is above the ", any_tensor_view::max_rank, " oomb views hold");
  std::int64_t row_major[any_tensor_view::max_rank];
  const std::int64_t* strides = t.strides;
  if (strides == nullptr) {  // compact row-major, as DLPack defines a null strides pointer
    std::int64_t s = 1;
    for (int d = t.ndim; d-- > 0;) {
      row_major[d] = s;
      s *= t.shape[d];
    }
    strides = row_major;
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return any_tensor_view(data, dtype{static_cast<dtype_code>(code), t.dtype.bits}, t.ndim, t.shape, strides, kind,
                         t.device.device_id);
}

/// The typed view of a DLTensor: view_of(t).as<E, Rank>() (dtype, rank and alignment checked;
/// a bfloat16 tensor reads as any bf16-layout-compatible E, oomb::bf16 or __nv_bfloat16).
template <class E, std::size_t Rank>
tensor_view<E, Rank> view_of(const DLTensor& t) {
  return view_of(t).template as<E, Rank>();
}

/// The same for a DLManagedTensor: a view of its dl_tensor. The managed tensor is not consumed;
/// its owner calls its deleter once the view is no longer used.
inline any_tensor_view view_of(const DLManagedTensor& m) { return view_of(m.dl_tensor); }
template <class E, std::size_t Rank>
tensor_view<E, Rank> view_of(const DLManagedTensor& m) {
  return view_of<E, Rank>(m.dl_tensor);
}

/// A DLManagedTensor over `v`'s memory for a consumer (torch.from_dlpack, at::fromDLPack, ...),
/// which calls its deleter when done; the deleter frees the DLManagedTensor and then calls
/// on_release(context) when on_release is not null. oomb never frees the memory. Throws
/// out_of_memory if the small descriptor cannot be allocated.
inline DLManagedTensor* to_dlpack(const any_tensor_view& v, void (*on_release)(void*) = nullptr,
                                  void* context = nullptr) {
  auto* e = new (std::nothrow) detail::dlpack_export{};
  OOMB_CHECK(e != nullptr, out_of_memory, "dlpack: could not allocate a DLManagedTensor");
  for (std::int32_t d = 0; d < v.rank(); ++d) {
    e->shape[d] = v.shape()[d];
    e->strides[d] = v.strides()[d];
  }
  DLTensor& t = e->managed.dl_tensor;
  t.data = v.data();
  t.device = detail::dlpack_device(v.kind(), v.device());
  t.ndim = v.rank();
  t.dtype.code = static_cast<std::uint8_t>(v.type().code);
  t.dtype.bits = v.type().bits;
  t.dtype.lanes = 1;
  t.shape = e->shape;
  t.strides = e->strides;
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = detail::dlpack_export_deleter;
  e->on_release = on_release;
  e->context = context;
  return &e->managed;
}

/// The same from a typed view (device: the GPU ordinal of device or pinned memory).
template <class E, std::size_t Rank>
DLManagedTensor* to_dlpack(const tensor_view<E, Rank>& v, std::int32_t device = 0,
                           void (*on_release)(void*) = nullptr, void* context = nullptr) {
  return to_dlpack(any_tensor_view::of(v, device), on_release, context);
}

OOMB_NAMESPACE_END
