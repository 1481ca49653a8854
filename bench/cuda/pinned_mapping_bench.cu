// oomb — what pinning host memory costs in device memory, by the way it is pinned.
// SPDX-License-Identifier: Apache-2.0
//
// With offload, every K/V and gradient page lives in pinned host memory, and the trainer's GPU
// peak still grows by ~8 bytes per 4 KiB pinned (1.56 MB per 10K tokens at Qwen2.5-0.5B,
// docs/benchmarks.md): the driver's mapping of the pinned pages into the device's address space.
// This measures that cost (cudaMemGetInfo's used bytes before and after) for each way of pinning
// `--gib` GiB in slabs of `--slab-mib` MiB, and checks that a copy engine reads every slab (a
// device-to-host and a host-to-device copy of its first and last MiB, compared):
//   cudaHostAlloc (default flags; Portable | Mapped, as pinned_resource does),
//   mmap + cudaHostRegister (4 KiB pages; transparent huge pages by madvise),
//   cuMemCreate on the host (CU_MEM_LOCATION_TYPE_HOST_NUMA, 2 MiB granularity) mapped for the device.
// One JSON line per method to --json FILE. Run on the GPU machine:
//   pinned_mapping_bench --gib 16 --slab-mib 256 --json results/pinned_mapping_h200.jsonl
// Measured on the H200 (results/pinned_mapping_h200.txt): 8 bytes per 4 KiB for every method.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pinned_mapping_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorString(e, &s);
    std::fprintf(stderr, "pinned_mapping_bench: %s: %s\n", what, s ? s : "?");
    std::exit(1);
  }
}

std::size_t used_device_bytes() {
  std::size_t free = 0, total = 0;
  check(cudaDeviceSynchronize(), "sync");
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

/// One way to pin: allocate(bytes) -> host pointer (device-accessible), release(pointer, bytes).
struct method {
  std::string name;
  std::function<void*(std::size_t)> allocate;
  std::function<void(void*, std::size_t)> release;
};

void* mmap_bytes(std::size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (huge && madvise(p, bytes, MADV_HUGEPAGE) != 0) std::perror("madvise(MADV_HUGEPAGE)");
  std::memset(p, 0, bytes);  // fault the pages in (huge ones where THP gives them)
  return p;
}

std::vector<method> methods(int device) {
  std::vector<method> m;
  m.push_back({"cudaHostAlloc(default)",
               [](std::size_t b) { void* p = nullptr; check(cudaHostAlloc(&p, b, cudaHostAllocDefault), "cudaHostAlloc"); return p; },
               [](void* p, std::size_t) { check(cudaFreeHost(p), "cudaFreeHost"); }});
  m.push_back({"cudaHostAlloc(Portable|Mapped)",
               [](std::size_t b) {
                 void* p = nullptr;
                 check(cudaHostAlloc(&p, b, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc");
                 return p;
               },
               [](void* p, std::size_t) { check(cudaFreeHost(p), "cudaFreeHost"); }});
  for (bool huge : {false, true})
    m.push_back({huge ? "mmap+THP+cudaHostRegister" : "mmap+cudaHostRegister",
                 [huge](std::size_t b) {
                   void* p = mmap_bytes(b, huge);
                   check(cudaHostRegister(p, b, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
                   return p;
                 },
                 [](void* p, std::size_t b) {
                   check(cudaHostUnregister(p), "cudaHostUnregister");
                   munmap(p, b);
                 }});
  m.push_back({"cuMemCreate(HOST_NUMA)+cuMemMap",
               [device](std::size_t b) {
                 CUmemAllocationProp prop{};
                 prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
                 prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
                 prop.location.id = 0;
                 CUmemGenericAllocationHandle h;
                 check(cuMemCreate(&h, b, &prop, 0), "cuMemCreate(host)");
                 CUdeviceptr va = 0;
                 check(cuMemAddressReserve(&va, b, 0, 0, 0), "cuMemAddressReserve");
                 check(cuMemMap(va, b, 0, h, 0), "cuMemMap");
                 CUmemAccessDesc access[2]{};
                 access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                 access[0].location.id = device;
                 access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                 access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
                 access[1].location.id = 0;
                 access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                 check(cuMemSetAccess(va, b, access, 2), "cuMemSetAccess");
                 check(cuMemRelease(h), "cuMemRelease");  // the mapping keeps it alive
                 return reinterpret_cast<void*>(va);
               },
               [](void* p, std::size_t b) {
                 const auto va = reinterpret_cast<CUdeviceptr>(p);
                 check(cuMemUnmap(va, b), "cuMemUnmap");
                 check(cuMemAddressFree(va, b), "cuMemAddressFree");
               }});
  return m;
}

/// A copy engine reads and writes the slab: its first and last MiB round-trip through the device.
bool slab_works(void* host, std::size_t bytes, unsigned char* dev, std::vector<unsigned char>& scratch) {
  const std::size_t mib = std::size_t(1) << 20;
  for (std::size_t at : {std::size_t(0), bytes - mib}) {
    auto* h = static_cast<unsigned char*>(host) + at;
    for (std::size_t i = 0; i < mib; ++i) h[i] = static_cast<unsigned char>((i * 131 + at / mib) & 0xff);
    check(cudaMemcpy(dev, h, mib, cudaMemcpyHostToDevice), "H2D");
    std::memset(h, 0, mib);
    check(cudaMemcpy(h, dev, mib, cudaMemcpyDeviceToHost), "D2H");
    for (std::size_t i = 0; i < mib; ++i)
      if (h[i] != static_cast<unsigned char>((i * 131 + at / mib) & 0xff)) return false;
  }
  (void)scratch;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 16;
  std::size_t slab_mib = 256;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gib" && i + 1 < argc) gib = std::atof(argv[++i]);
    else if (a == "--slab-mib" && i + 1 < argc) slab_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: pinned_mapping_bench [--gib G] [--slab-mib M] [--json FILE]\n");
      return 2;
    }
  }
  const std::size_t slab = slab_mib << 20;
  const auto slabs = static_cast<std::size_t>(gib * double(std::size_t(1) << 30) / double(slab));
  int device = 0;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  check(cuInit(0), "cuInit");
  unsigned char* dev = nullptr;
  check(cudaMalloc(&dev, std::size_t(1) << 20), "cudaMalloc");
  std::vector<unsigned char> scratch;
  std::ofstream out;
  if (!json.empty()) out.open(json, std::ios::app);
  std::printf("%-34s %10s %14s %16s %s\n", "method", "pinned GiB", "device MiB", "bytes per 4 KiB", "copies");
  for (const method& m : methods(device)) {
    const std::size_t before = used_device_bytes();
    std::vector<void*> held;
    bool ok = true;
    for (std::size_t s = 0; s < slabs; ++s) held.push_back(m.allocate(slab));
    const std::size_t after = used_device_bytes();
    for (void* p : held) ok = ok && slab_works(p, slab, dev, scratch);
    for (void* p : held) m.release(p, slab);
    const std::size_t released = used_device_bytes();
    const double pinned = double(slabs * slab);
    const double grown = double(after) - double(before);
    const double per_page = grown / (pinned / 4096.0);
    std::printf("%-34s %10.2f %14.2f %16.3f %s (after release: %+.2f MiB)\n", m.name.c_str(), pinned / double(1 << 30),
                grown / double(1 << 20), per_page, ok ? "ok" : "WRONG", (double(released) - double(before)) / double(1 << 20));
    if (out)
      out << "{\"method\": \"" << m.name << "\", \"pinned_bytes\": " << std::uint64_t(pinned) << ", \"slab_bytes\": " << slab
          << ", \"device_bytes\": " << std::int64_t(grown) << ", \"device_bytes_per_4k\": " << per_page
          << ", \"copies_ok\": " << (ok ? "true" : "false") << "}\n";
  }
  check(cudaFree(dev), "cudaFree");
  return 0;
}
