// Dispatch (one NVLink domain): persistent, one CTA per SM, warp-specialised.
//   loader warp  : TMA-loads each token row that leaves this rank into a shared-memory ring
//                  (full/empty mbarriers per stage);
//   store warps  : write each row with one TMA bulk store per destination rank straight into
//                  that rank's registered buffer, plus its probs and FP8 scales;
//   after a chunk: one monotonic flag per (source, chunk) in every destination, also for chunks
//                  with nothing for it; finally each block waits for the chunks it receives.
// Chunk c belongs to block c % gridDim.x on every rank.
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/runtime/cuda_check.h"

namespace hybrid_ep {
namespace {

constexpr int kStoreWarps = 2;
// Each store warp holds one stage while it waits for its next item, so the ring needs two
// stages per store warp to never starve the loader.
constexpr int kMinStages = 2 * kStoreWarps;
constexpr int kThreads = 32 * (1 + kStoreWarps);
constexpr uint32_t kStoreBarrier = 1;  // named barrier of the store warps

struct Ring {
  uint8_t* rows;
  uint64_t* full;
  uint64_t* empty;
  int stages;
  int stride;
  __device__ uint8_t* row(int stage) const { return rows + size_t(stage) * stride; }
};

__device__ __forceinline__ Ring carve_ring(uint8_t* smem, const DispatchParams& p) {
  Ring ring;
  ring.stages = p.stages;
  ring.stride = (p.row_bytes + 127) / 128 * 128;
  ring.rows = smem;
  ring.full = reinterpret_cast<uint64_t*>(smem + size_t(ring.stride) * p.stages);
  ring.empty = ring.full + p.stages;
  return ring;
}

__device__ __forceinline__ const int32_t* dest_rows(const DispatchParams& p, int t) {
  return p.sparse_to_dense_map + int64_t(t) * p.domain.ranks;
}

__device__ __forceinline__ bool leaves_rank(const DispatchParams& p, int t) {
  const int32_t* rows = dest_rows(p, t);
  for (int j = 0; j < p.domain.ranks; ++j) {
    if (rows[j] >= 0) return true;
  }
  return false;
}

__device__ __forceinline__ int chunk_end(const DispatchParams& p, int c) {
  return min((c + 1) * p.chunk, min(p.num_tokens, p.max_tokens));
}

// Loader warp, one lane: the ring producer.
__device__ void load_rows(const DispatchParams& p, const Ring& ring) {
  uint32_t item = 0;
  for (int c = blockIdx.x; c < p.max_chunks; c += gridDim.x) {
    for (int t = c * p.chunk; t < chunk_end(p, c); ++t) {
      if (!leaves_rank(p, t)) continue;
      const int stage = item % ring.stages;
      ptx::mbar_wait(&ring.empty[stage], ((item / ring.stages) & 1) ^ 1);
      ptx::mbar_arrive_expect_tx(&ring.full[stage], p.row_bytes);
      ptx::bulk_load(ring.row(stage), p.hidden + int64_t(t) * p.row_bytes, p.row_bytes,
                     &ring.full[stage]);
      ++item;
    }
  }
}

// Probs (one domain's columns) and scales of token t to destination row `row` of rank j: small
// and not 16-byte aligned in general, so the warp's lanes copy them with plain stores.
__device__ __forceinline__ void store_side_data(const DispatchParams& p, int t, int j, int row,
                                                int lane) {
  uint8_t* peer = p.domain.peer(j);
  if (p.probs != nullptr) {
    const float* src = p.probs + int64_t(t) * p.experts_total + p.prob_col_offset;
    float* dst = reinterpret_cast<float*>(peer + p.dispatch_probs) + int64_t(row) * p.prob_cols;
    for (int k = lane; k < p.prob_cols; k += 32) dst[k] = src[k];
  }
  if (p.scales != nullptr) {
    const float* src = p.scales + int64_t(t) * p.scale_cols;
    float* dst = reinterpret_cast<float*>(peer + p.dispatch_scales) + int64_t(row) * p.scale_cols;
    for (int k = lane; k < p.scale_cols; k += 32) dst[k] = src[k];
  }
}

// Store warp `w`: consumes ring items w, w + kStoreWarps, ...; releases a stage once the bulk
// stores that read it are done reading.
__device__ void store_rows(const DispatchParams& p, const Ring& ring, int w, int lane) {
  const DomainView& d = p.domain;
  uint32_t item = 0;
  int pending_stage = -1;  // stage whose stores were committed but maybe not read yet
  for (int c = blockIdx.x; c < p.max_chunks; c += gridDim.x) {
    for (int t = c * p.chunk; t < chunk_end(p, c); ++t) {
      if (!leaves_rank(p, t)) continue;
      const uint32_t mine = item++;
      if (int(mine % kStoreWarps) != w) continue;
      const int stage = mine % ring.stages;
      ptx::mbar_wait(&ring.full[stage], (mine / ring.stages) & 1);
      const int32_t* rows = dest_rows(p, t);
      for (int j = 0; j < d.ranks; ++j) {
        const int row = rows[j];
        if (row < 0) continue;
        if (lane == 0) {
          ptx::bulk_store(d.peer(j) + p.dispatch_rows + int64_t(row) * p.row_bytes,
                          ring.row(stage), p.row_bytes);
        }
        store_side_data(p, t, j, row, lane);
      }
      if (lane == 0) {
        ptx::bulk_commit();
        ptx::bulk_wait_read<1>();  // the previous item's group no longer reads its stage
        if (pending_stage >= 0) ptx::mbar_arrive(&ring.empty[pending_stage]);
      }
      pending_stage = stage;
    }
    // Chunk done: make every write of this block's store warps visible, then signal it to
    // every rank of the domain (including those that got nothing from it).
    if (lane == 0) {
      ptx::bulk_wait<0>();
      if (pending_stage >= 0) ptx::mbar_arrive(&ring.empty[pending_stage]);
      ptx::fence_proxy_async_global();
    }
    pending_stage = -1;
    __threadfence_system();
    ptx::named_barrier(kStoreBarrier, 32 * kStoreWarps);
    if (w == 0) {
      const size_t slot = sizeof(uint64_t) * (size_t(d.local_rank) * p.max_chunks + c);
      for (int j = lane; j < d.ranks; j += 32) {
        signal_flag(reinterpret_cast<uint64_t*>(d.peer(j) + p.dispatch_flags + slot));
      }
    }
  }
}

// All threads: wait for every chunk this block receives (chunk c of every local rank).
__device__ void wait_incoming(const DispatchParams& p) {
  const DomainView& d = p.domain;
  const int my_chunks = (p.max_chunks - int(blockIdx.x) + gridDim.x - 1) / gridDim.x;
  for (int k = threadIdx.x; k < my_chunks * d.ranks; k += blockDim.x) {
    const int source = k % d.ranks;
    const int c = blockIdx.x + (k / d.ranks) * gridDim.x;
    const size_t slot = p.dispatch_flags + sizeof(uint64_t) * (size_t(source) * p.max_chunks + c);
    if (!wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot),
                   d.timeout_ns, d.status, d.abort, WaitSite::kDispatchChunk, source, c)) {
      return;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_kernel(DispatchParams p) {
  // After a failed wait the buffer is unusable: do nothing rather than touch peers.
  if (p.domain.aborted()) return;
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring ring = carve_ring(smem, p);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring.stages; ++s) {
      ptx::mbar_init(&ring.full[s], 1);
      ptx::mbar_init(&ring.empty[s], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) load_rows(p, ring);
  } else {
    store_rows(p, ring, warp - 1, lane);
  }
  __syncthreads();
  wait_incoming(p);
}

}  // namespace

int dispatch_min_stages() { return kMinStages; }

size_t dispatch_smem_bytes(int row_bytes, int stages) {
  return size_t((row_bytes + 127) / 128 * 128) * stages + 2 * sizeof(uint64_t) * stages;
}

void launch_dispatch(const DispatchParams& p, int blocks, cudaStream_t stream) {
  const size_t smem = dispatch_smem_bytes(p.row_bytes, p.stages);
  static int configured = 0;  // the attribute is per function; raise it only when needed
  if (int(smem) > configured) {
    HYBRID_EP_CUDA_CHECK(cudaFuncSetAttribute(
        dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    configured = int(smem);
  }
  dispatch_kernel<<<blocks, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep
