// Metadata preprocessing: from the gathered routing, the handle's maps (docs/semantics.md).
// Pass 1 (many blocks): one destination-rank bit mask per token. Pass 2 (one block per
// destination rank of this domain, in parallel): a block-wide exclusive scan over all tokens
// in source order gives every token's row there (and, for this rank, the first row of every
// source chunk: the dense chunk layout), rows past the receive cap dropped; one more block
// writes the domain-level maps.
#include <cub/block/block_scan.cuh>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kItemsPerThread = 8;
constexpr int kTile = kScanThreads * kItemsPerThread;

__global__ void dest_mask_kernel(MetadataParams p) {
  // The first kernel after the all-gather: a mismatch it found stops the call here.
  if (p.domain.settle()) return;
  const int world = p.domain.world;
  const int experts = p.experts_per_rank;
  const int64_t tokens = int64_t(world) * p.max_tokens;
  const int64_t row_bytes = int64_t(experts) * world;
  // Rows of a multiple of 16 bytes start 16-byte aligned (the region is): read them by words.
  const bool by_words = row_bytes % 16 == 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* row = p.routing + i * row_bytes;
    uint64_t mask = 0;
    if (by_words) {
      for (int w = 0; w < row_bytes / 16; ++w) {
        const uint4 word = reinterpret_cast<const uint4*>(row)[w];
        const uint32_t parts[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          if ((parts[k / 4] >> (8 * (k % 4))) & 0xff) mask |= 1ull << ((16 * w + k) / experts);
        }
      }
    } else {
      for (int b = 0; b < row_bytes; ++b) {
        if (row[b]) mask |= 1ull << (b / experts);
      }
    }
    p.dest_masks[i] = mask;
  }
}

__device__ __forceinline__ bool goes_to_node(uint64_t mask, int node, int ranks) {
  const uint64_t node_bits = (ranks == 64 ? ~0ull : ((1ull << ranks) - 1)) << (node * ranks);
  return (mask & node_bits) != 0;
}

// rdma_to_attn_map, attn_to_rdma_map, the largest token count and the most rows routed to any
// rank (before the receive cap): no scan needed. Every rank counts those rows from the same
// gathered masks, so a blocking call that must grow the receive regions knows it on every rank
// without an exchange.
__device__ void write_domain_maps(const MetadataParams& p, int64_t tokens, int me) {
  const DomainView& d = p.domain;
  const int T = p.max_tokens;
  __shared__ unsigned int routed[64];  // rows routed to each rank of the group (W <= 64)
  for (int r = threadIdx.x; r < d.world; r += blockDim.x) routed[r] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < tokens; i += blockDim.x) {
    const int source = int(i / T);
    const int t = int(i % T);
    const uint64_t mask = p.dest_masks[i];
    for (uint64_t m = mask; m != 0; m &= m - 1) {
      atomicAdd(&routed[__ffsll(static_cast<long long>(m)) - 1], 1u);
    }
    if (source % d.ranks == d.local_rank) {
      p.rdma_to_attn_map[int64_t(t) * d.nodes + source / d.ranks] =
          goes_to_node(mask, d.node_rank, d.ranks);
    }
    if (source == me) {
      int k = 0;
      for (int node = 0; node < d.nodes; ++node) {
        if (node == d.node_rank) continue;
        p.attn_to_rdma_map[int64_t(t) * (d.nodes - 1) + k++] = goes_to_node(mask, node, d.ranks);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t largest = 0;
    unsigned int most = 0;
    for (int r = 0; r < d.world; ++r) {
      largest = max(largest, p.token_counts[r]);
      most = max(most, routed[r]);
    }
    p.summary->largest = int64_t(largest);
    p.summary->largest_received = int64_t(most);
  }
  // Every rank has every rank's stamp here, so every rank finds a disagreement.
  for (int r = threadIdx.x; r < d.world; r += blockDim.x) {
    stamps_agree(d, p.call_stamps[r], WaitSite::kGatheredStamps, r, true);
  }
}

// Block j < R: rows in local rank j of this domain. Block R: the domain-level maps.
__global__ void __launch_bounds__(kScanThreads) scan_kernel(MetadataParams p) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int running;  // rows assigned so far
  if (p.domain.aborted()) return;

  const DomainView& d = p.domain;
  const int T = p.max_tokens;
  const int64_t tokens = int64_t(d.world) * T;
  const int me = d.node_rank * d.ranks + d.local_rank;
  if (blockIdx.x == d.ranks) {
    write_domain_maps(p, tokens, me);
    return;
  }
  const int j = blockIdx.x;
  const int dest = d.node_rank * d.ranks + j;
  const int E = p.experts_per_rank;
  const int64_t routing_cols = int64_t(E) * d.world;
  const int cap = p.max_received;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t tile = 0; tile < tokens; tile += kTile) {
    // Bit k: token first + k goes to dest (one register, not the masks: the cap's test in the
    // loop below then fits in 64 registers without a spill).
    uint32_t hit_bits = 0;
    const int64_t first = tile + int64_t(threadIdx.x) * kItemsPerThread;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      const uint64_t mask = first + k < tokens ? p.dest_masks[first + k] : 0;
      hit_bits |= uint32_t((mask >> dest) & 1) << k;
    }
    const int hits = __popc(hit_bits);
    int offset;
    int tile_total;
    Scan(scan_storage).ExclusiveSum(hits, offset, tile_total);
    const int base = running;
    int row = base + offset;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      const int64_t i = first + k;
      if (i >= tokens) break;
      const bool hit = (hit_bits >> k) & 1;
      // Rows at or past the cap are dropped: -1 (no row) for every kernel that reads the map,
      // and no local expert, so nothing writes or reads past the receive regions.
      const bool kept = hit && row < cap;
      const int source = int(i / T);
      const int t = int(i % T);
      if (source % d.ranks == d.local_rank) {  // a peer whose tokens this rank forwards
        const int64_t forwarded = int64_t(source / d.ranks) * T + t;
        p.sparse_to_dense_map[forwarded * d.ranks + j] = kept ? row : -1;
      }
      if (dest == me && p.dense_chunk_layout != nullptr && t % p.chunk == 0) {
        const int chunks = (T + p.chunk - 1) / p.chunk;
        p.dense_chunk_layout[int64_t(source) * chunks + t / p.chunk] = min(row, cap);
      }
      if (dest == me && t == 0 && (source == me || source == me + 1)) {
        (source == me ? p.summary->own_begin : p.summary->own_end) = min(row, cap);
      }
      if (kept && dest == me) {
        const uint8_t* experts = p.routing + i * routing_cols + int64_t(me) * E;
        bool* out = p.local_expert_routing_map + int64_t(row) * E;
        for (int e = 0; e < E; ++e) out[e] = experts[e] != 0;
      }
      row += int(hit);
    }
    __syncthreads();  // everyone read `running` before it moves on
    if (threadIdx.x == 0) running = base + tile_total;
    __syncthreads();
  }
  if (dest == me && threadIdx.x == 0) {
    const int kept = min(running, cap);
    if (p.dense_chunk_layout != nullptr) {
      p.dense_chunk_layout[int64_t(d.world) * ((T + p.chunk - 1) / p.chunk)] = kept;
    }
    p.num_dispatched_tokens[0] = kept;
    p.summary->dispatched = kept;
    if (me == d.world - 1) p.summary->own_end = kept;
    if (p.dropped_rows != nullptr) p.dropped_rows[0] = running - kept;
  }
}

}  // namespace

void launch_metadata(const MetadataParams& p, int blocks, cudaStream_t stream) {
  dest_mask_kernel<<<blocks, 256, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
  scan_kernel<<<p.domain.ranks + 1, kScanThreads, 0, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep
