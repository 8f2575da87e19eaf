// Combine (one NVLink domain): persistent, one CTA per SM, warp-specialised.
//   loader warp  : TMA-pulls every copy of a token from the registered combine buffers of the
//                  ranks that received it into consecutive stages of a shared-memory ring;
//   reduce warps : each owns every kReduceWarps-th token of a chunk; once all copies of its
//                  token are in, it adds them in fp32 (ascending local rank, as the reference
//                  does), writes BF16 and the routed-back probs, and hands the stages back.
// Runs after a domain barrier that guarantees every peer's combine buffer is filled.
#include <cuda_bf16.h>

#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

constexpr int kReduceWarps = 8;
constexpr int kThreads = 32 * (1 + kReduceWarps);
constexpr uint32_t kReduceBarrier = 1;

__host__ __device__ constexpr int align_up(int v, int a) { return (v + a - 1) / a * a; }

// A stage holds one copy of a token: its row, then (TMA path) that copy's E probs.
__host__ __device__ inline int stage_stride(int row_bytes, int prob_bytes) {
  return align_up(align_up(row_bytes, 16) + prob_bytes, 128);
}

struct Ring {
  uint8_t* rows;
  uint64_t* full;
  uint64_t* empty;
  ChunkRoutes loader_routes, reduce_routes;
  int stages;
  int stride;
  int prob_at;     // offset of the probs in a stage
  int prob_bytes;  // 0 when probs are not carried by TMA
  // Items the loader has issued. Reduce warps run ahead of each other, so one may want an item
  // more than a ring round ahead of the loader, where a parity wait on its stage would see the
  // previous round complete; waiting for the issue first makes the parity unambiguous.
  uint32_t* issued;
  __device__ uint8_t* row(int stage) const { return rows + size_t(stage) * stride; }
};

__device__ __forceinline__ Ring carve_ring(uint8_t* smem, const CombineParams& p) {
  Ring ring;
  ring.stages = p.stages;
  ring.prob_bytes = p.out_probs != nullptr && p.probs_by_tma ? p.experts_per_rank * 4 : 0;
  ring.prob_at = align_up(p.row_bytes, 16);
  ring.stride = stage_stride(p.row_bytes, ring.prob_bytes);
  ring.rows = smem;
  ring.full = reinterpret_cast<uint64_t*>(smem + size_t(ring.stride) * p.stages);
  ring.empty = ring.full + p.stages;
  int32_t* routes = reinterpret_cast<int32_t*>(ring.empty + p.stages);
  ring.loader_routes = ChunkRoutes{routes, p.domain.ranks};
  ring.reduce_routes = ChunkRoutes{routes + p.chunk * p.domain.ranks, p.domain.ranks};
  ring.issued = reinterpret_cast<uint32_t*>(routes + 2 * p.chunk * p.domain.ranks);
  return ring;
}

// Loader warp: the warp stages the chunk's routes, lane 0 issues one stage per copy, in
// ascending local rank.
__device__ void load_copies(const CombineParams& p, const Ring& ring, int lane) {
  uint32_t item = 0;
  const int chunks = (p.num_tokens + p.chunk - 1) / p.chunk;
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int first = c * p.chunk;
    const int last = min(first + p.chunk, p.num_tokens);
    __syncwarp();  // lane 0 is done with the previous chunk's routes
    ring.loader_routes.load(p.sparse_to_dense_map, first, last, lane, 32);
    __syncwarp();
    if (lane != 0) continue;
    for (int t = first; t < last; ++t) {
      const int32_t* rows = ring.loader_routes.token(t - first);
      for (int j = 0; j < p.domain.ranks; ++j) {
        if (rows[j] < 0) continue;
        const int stage = item % ring.stages;
        ptx::mbar_wait(&ring.empty[stage], ((item / ring.stages) & 1) ^ 1);
        ptx::mbar_arrive_expect_tx(&ring.full[stage], p.row_bytes + ring.prob_bytes);
        const uint8_t* peer = p.domain.peer(j);
        ptx::bulk_load(ring.row(stage), peer + p.combine_rows + int64_t(rows[j]) * p.row_bytes,
                       p.row_bytes, &ring.full[stage]);
        if (ring.prob_bytes) {  // this copy's own E columns
          const int64_t at = int64_t(rows[j]) * p.prob_cols + j * p.experts_per_rank;
          ptx::bulk_load(ring.row(stage) + ring.prob_at, peer + p.combine_probs + 4 * at,
                         ring.prob_bytes, &ring.full[stage]);
        }
        ++item;
        *static_cast<volatile uint32_t*>(ring.issued) = item;
      }
    }
  }
}

__device__ __forceinline__ void accumulate(float (&acc)[8], const uint4& packed) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    acc[2 * k] += f.x;
    acc[2 * k + 1] += f.y;
  }
}

__device__ __forceinline__ uint4 to_bf16(const float (&acc)[8]) {
  uint4 packed;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
  return packed;
}

// The prob of column `col` of a token from the staged probs of the rank owning it (global
// load), or 0 when that rank did not receive the token. Columns of other domains are 0.
__device__ __forceinline__ float copy_prob(const CombineParams& p, const int32_t* rows, int col,
                                           int experts_total) {
  if (col >= experts_total) return 0.f;
  const int E = p.experts_per_rank;
  const int j = (col / E) % p.domain.ranks;
  if (col / (E * p.domain.ranks) != p.domain.node_rank || rows[j] < 0) return 0.f;
  const float* src = reinterpret_cast<const float*>(p.domain.peer(j) + p.combine_probs);
  return src[int64_t(rows[j]) * p.prob_cols + j * E + col % E];
}

// combined_probs row of token t: each receiving rank's own E columns, zeros elsewhere.
__device__ __forceinline__ void write_probs(const CombineParams& p, const Ring& ring,
                                            const int32_t* rows, int t, uint32_t item,
                                            float early_prob, int thread, int threads) {
  const int E = p.experts_per_rank;
  const int experts_total = E * p.domain.ranks * p.domain.nodes;
  float* dst = p.out_probs + int64_t(t) * experts_total;
  for (int col = thread; col < experts_total; col += threads) {
    float value;
    if (ring.prob_bytes) {
      const int j = (col / E) % p.domain.ranks;
      value = 0.f;
      if (col / (E * p.domain.ranks) == p.domain.node_rank && rows[j] >= 0) {
        int k = 0;  // copies are staged in ascending local rank
        for (int i = 0; i < j; ++i) k += rows[i] >= 0;
        const uint8_t* stage = ring.row((item + k) % ring.stages);
        value = reinterpret_cast<const float*>(stage + ring.prob_at)[col % E];
      }
    } else {
      value = col == thread ? early_prob : copy_prob(p, rows, col, experts_total);
    }
    dst[col] = value;
  }
}

// Reduce warps: warp w owns tokens w, w + kReduceWarps, ... of each chunk and reduces them on
// its own (lanes own 8-element slices of the row), so no warp ever waits for another one
// except once per chunk, before the shared routes are replaced.
__device__ void reduce_copies(const CombineParams& p, const Ring& ring, int warp, int lane) {
  constexpr int kReduceThreads = 32 * kReduceWarps;
  const int vectors = p.hidden / 8;
  const int experts_total = p.experts_per_rank * p.domain.ranks * p.domain.nodes;
  const int thread = warp * 32 + lane;
  uint32_t item = 0;  // ring position of the chunk's first copy
  const int chunks = (p.num_tokens + p.chunk - 1) / p.chunk;
  for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int first = c * p.chunk;
    const int last = min(first + p.chunk, p.num_tokens);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);  // done with the previous routes
    ring.reduce_routes.load(p.sparse_to_dense_map, first, last, thread, kReduceThreads);
    ptx::named_barrier(kReduceBarrier, kReduceThreads);
    for (int t = first; t < last; ++t) {
      const int32_t* rows = ring.reduce_routes.token(t - first);
      const int copies = ring.reduce_routes.copies(t - first);
      if ((t - first) % kReduceWarps != warp) {
        item += copies;
        continue;
      }
      // Without the TMA path, issue this lane's prob load before waiting, to hide it.
      const float early_prob = p.out_probs != nullptr && !ring.prob_bytes
                                   ? copy_prob(p, rows, lane, experts_total)
                                   : 0.f;
      if (copies > 0) {
        while (*static_cast<volatile uint32_t*>(ring.issued) < item + copies) {
        }
      }
      for (int k = 0; k < copies; ++k) {
        const uint32_t it = item + k;
        ptx::mbar_wait(&ring.full[it % ring.stages], (it / ring.stages) & 1);
      }
      uint4* out = reinterpret_cast<uint4*>(p.out + int64_t(t) * p.hidden);
      for (int v = lane; v < vectors; v += 32) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k = 0; k < copies; ++k) {
          const uint8_t* stage = ring.row((item + k) % ring.stages);
          accumulate(acc, reinterpret_cast<const uint4*>(stage)[v]);
        }
        out[v] = to_bf16(acc);
      }
      if (p.out_probs != nullptr) write_probs(p, ring, rows, t, item, early_prob, lane, 32);
      __syncwarp();  // every lane is done with these stages before they are handed back
      if (lane == 0) {
        for (int k = 0; k < copies; ++k) ptx::mbar_arrive(&ring.empty[(item + k) % ring.stages]);
      }
      item += copies;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) combine_kernel(CombineParams p) {
  // After a failed wait (e.g. the barrier before this kernel) peers' rows are not staged.
  if (p.domain.aborted()) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring ring = carve_ring(smem, p);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.stages; ++s) {
      ptx::mbar_init(&ring.full[s], 1);
      ptx::mbar_init(&ring.empty[s], 1);
    }
    *ring.issued = 0;
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    load_copies(p, ring, threadIdx.x);
  } else {
    reduce_copies(p, ring, warp - 1, threadIdx.x % 32);
  }
}

}  // namespace

size_t combine_stage_bytes(int row_bytes, int prob_bytes) {
  return stage_stride(row_bytes, prob_bytes) + 2 * sizeof(uint64_t);
}

size_t combine_smem_bytes(int row_bytes, int prob_bytes, int stages, int chunk, int ranks) {
  return size_t(stage_stride(row_bytes, prob_bytes)) * stages + 2 * sizeof(uint64_t) * stages +
         2 * sizeof(int32_t) * chunk * ranks + 16;
}

void launch_combine(const CombineParams& p, int blocks, cudaStream_t stream) {
  const int prob_bytes = p.out_probs != nullptr && p.probs_by_tma ? p.experts_per_rank * 4 : 0;
  const size_t smem =
      combine_smem_bytes(p.row_bytes, prob_bytes, p.stages, p.chunk, p.domain.ranks);
  allow_dynamic_smem(reinterpret_cast<const void*>(combine_kernel), smem);
  combine_kernel<<<blocks, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep
