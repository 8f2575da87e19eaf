// A ring kernel's dynamic shared memory, planned once for both sides: the host sizes the launch
// and picks the ring's depth from the same plan the kernel carves its pointers with.
// The ring comes first: `stages` stages of `stride` bytes (a multiple of 128) from the 128-byte
// aligned base, then the stages' full and empty mbarriers (kernels/common/ring.cuh). The
// kernel's other parts follow in the order it places them, each at its alignment. None is
// aligned to more than the barriers (8 bytes), so the bytes besides the ring do not depend on
// its depth: the host asks for them with a plan of no stages (reserved()).
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for the host compiler

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

struct SmemPlan {
  int stride = 0;  // bytes per stage
  int stages = 0;
  size_t full = 0, empty = 0;  // offsets of the barriers, [stages] each
  size_t ring_end = 0;         // where the parts besides the ring begin
  size_t end = 0;              // bytes placed so far

  __host__ __device__ SmemPlan(int stride, int stages) : stride(stride), stages(stages) {
    full = size_t(stride) * stages;
    empty = full + sizeof(uint64_t) * stages;
    ring_end = end = empty + sizeof(uint64_t) * stages;
  }

  // Places `count` T's after the parts placed so far, at `align` (at most 8, see above);
  // returns their offset.
  template <class T>
  __host__ __device__ size_t place(size_t count, size_t align = alignof(T)) {
    const size_t at = (end + align - 1) / align * align;
    end = at + sizeof(T) * count;
    return at;
  }

  __host__ __device__ size_t bytes() const { return end; }
  // Everything besides the ring's stages and barriers.
  __host__ __device__ size_t reserved() const { return end - ring_end; }
  // What one more stage adds: its bytes and its two barriers.
  __host__ __device__ static size_t stage_bytes(int stride) {
    return size_t(stride) + 2 * sizeof(uint64_t);
  }
};

// Shared memory the host leaves free besides a plan: the kernels' static __shared__ variables
// (the combine's warp-scan storage) come out of the same per-block limit.
constexpr size_t kStaticSmemSlack = 1024;

// How many stages of `stage_bytes` fit in a block's `limit` bytes of shared memory next to
// `reserved` bytes of other parts.
inline int stages_that_fit(int limit, size_t stage_bytes, size_t reserved) {
  if (size_t(limit) < reserved + kStaticSmemSlack) return 0;
  return int((size_t(limit) - reserved - kStaticSmemSlack) / stage_bytes);
}

}  // namespace hybrid_ep
