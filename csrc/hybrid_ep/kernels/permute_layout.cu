// The permuted layout on the device, with no host synchronisation (non-blocking mode, CUDA
// graphs). Pass 1, one block per local expert: a block-wide scan over the dispatch rows gives
// each selected row its rank inside the expert (kept in dense_to_expert_map) and the expert's
// row count. Pass 2, many blocks: every block derives the padded segment offsets from the
// counts, then turns ranks into output rows, fills the inverse map the permute kernel gathers
// with, and flags rows that fall past num_permuted.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kItemsPerThread = 4;
constexpr int kTile = kScanThreads * kItemsPerThread;
constexpr int kMapThreads = 256;

__global__ void __launch_bounds__(kScanThreads) rank_in_expert_kernel(PermuteLayoutParams p) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int running;
  const int e = blockIdx.x;
  const int E = p.experts_per_rank;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int tile = 0; tile < p.rows; tile += kTile) {
    const int first = tile + threadIdx.x * kItemsPerThread;
    bool hit[kItemsPerThread];
    int hits = 0;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      hit[k] = first + k < p.rows && p.local_expert_routing_map[int64_t(first + k) * E + e];
      hits += hit[k];
    }
    int offset, total;
    Scan(scan_storage).ExclusiveSum(hits, offset, total);
    const int base = running;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      if (first + k >= p.rows) break;
      p.dense_to_expert_map[int64_t(first + k) * E + e] = hit[k] ? base + offset : -1;
      offset += hit[k];
    }
    __syncthreads();  // everyone read `running`
    if (threadIdx.x == 0) running = base + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.raw_tokens_per_expert[e] = running;
}

__global__ void __launch_bounds__(kMapThreads) place_rows_kernel(PermuteLayoutParams p) {
  extern __shared__ int64_t offsets[];  // [E]: first output row of each expert's segment
  const int E = p.experts_per_rank;
  if (threadIdx.x == 0) {
    int64_t at = 0;
    for (int e = 0; e < E; ++e) {
      const int64_t padded = (int64_t(p.raw_tokens_per_expert[e]) + p.pad_multiple - 1) /
                             p.pad_multiple * p.pad_multiple;
      offsets[e] = at;
      if (blockIdx.x == 0) {
        p.tokens_per_expert[e] = max(int64_t(0), min(padded, int64_t(p.num_permuted) - at));
      }
      at += padded;
    }
  }
  __syncthreads();
  const int64_t items = int64_t(p.rows) * E;
  for (int64_t i = blockIdx.x * int64_t(kMapThreads) + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * kMapThreads) {
    const int32_t rank = p.dense_to_expert_map[i];
    if (rank < 0) continue;
    const int e = int(i % E);
    const int64_t target = offsets[e] + rank;
    if (target < p.num_permuted) {
      p.dense_to_expert_map[i] = int32_t(target);
      p.row_source[target] = int32_t(i);  // = dispatch row * E + expert
    } else {
      p.dense_to_expert_map[i] = -1;
      *p.overflow = 1;
    }
  }
}

}  // namespace

void launch_permute_layout(const PermuteLayoutParams& p, int blocks, cudaStream_t stream) {
  if (p.num_permuted > 0) {  // padding and tail rows stay -1
    HYBRID_EP_CUDA_CHECK(
        cudaMemsetAsync(p.row_source, 0xff, size_t(p.num_permuted) * sizeof(int32_t), stream));
  }
  HYBRID_EP_CUDA_CHECK(cudaMemsetAsync(p.overflow, 0, sizeof(int32_t), stream));
  rank_in_expert_kernel<<<p.experts_per_rank, kScanThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  const int64_t items = int64_t(p.rows) * p.experts_per_rank;
  const int needed = int((items + kMapThreads - 1) / kMapThreads);
  place_rows_kernel<<<std::max(1, std::min(blocks, needed)), kMapThreads,
                      sizeof(int64_t) * p.experts_per_rank, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep
