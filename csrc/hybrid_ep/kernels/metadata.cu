// Metadata preprocessing: from the gathered routing, the handle's maps (docs/semantics.md).
// Every gathered row holds its token's bits for this domain's experts only
// (kernels/common/routing_bits.h); which other domains this rank's own tokens go to comes from
// its staged bits for them. Pass 1 (many blocks): one mask of this domain's destination ranks
// per token. Pass 2 (one block per
// destination rank of this domain, in parallel): a block-wide exclusive scan over all tokens
// in source order gives every token's row there (and, for this rank, the first row of every
// source chunk: the dense chunk layout), rows past the receive cap dropped; one more block
// writes the domain-level maps.
#include <cub/block/block_scan.cuh>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/routing_bits.h"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kItemsPerThread = 8;
constexpr int kTile = kScanThreads * kItemsPerThread;

__global__ void dest_mask_kernel(MetadataParams p) {
  // The first kernel after the all-gather: a mismatch it found stops the call here.
  if (p.domain.settle()) return;
  const int64_t tokens = int64_t(p.domain.world) * p.max_tokens;
  const int words = p.routing_words;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x) {
    p.dest_masks[i] = ranks_of_routing_words(p.routing + i * words, words, p.experts_per_rank);
  }
}

// Whether this rank's token t goes to the k-th other domain: any of its staged bits for it.
__device__ bool own_token_leaves(const MetadataParams& p, int k, int t) {
  const uint32_t* words = p.staged_routing + (int64_t(k) * p.max_tokens + t) * p.routing_words;
  for (int w = 0; w < p.routing_words; ++w) {
    if (words[w] != 0) return true;
  }
  return false;
}

// rdma_to_attn_map, attn_to_rdma_map and the largest token count: no scan needed.
__device__ void write_domain_maps(const MetadataParams& p) {
  const DomainView& d = p.domain;
  const int T = p.max_tokens;
  // The tokens this rank forwards, token t of its peer in domain n: bound for this domain's
  // ranks (their masks are over those) or not.
  for (int64_t f = threadIdx.x; f < int64_t(d.nodes) * T; f += blockDim.x) {
    const int n = int(f / T);
    const int t = int(f % T);
    const int64_t i = int64_t(n * d.ranks + d.local_rank) * T + t;
    p.rdma_to_attn_map[int64_t(t) * d.nodes + n] = p.dest_masks[i] != 0;
  }
  for (int64_t i = threadIdx.x; i < int64_t(T) * (d.nodes - 1); i += blockDim.x) {
    p.attn_to_rdma_map[i] = own_token_leaves(p, int(i % (d.nodes - 1)), int(i / (d.nodes - 1)));
  }
  if (threadIdx.x == 0) {
    uint64_t largest = 0;
    for (int r = 0; r < d.world; ++r) largest = max(largest, p.token_counts[r]);
    p.summary->largest = int64_t(largest);
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
    write_domain_maps(p);
    return;
  }
  const int j = blockIdx.x;
  const int dest = d.node_rank * d.ranks + j;
  const int E = p.experts_per_rank;
  const int cap = p.max_received;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t tile = 0; tile < tokens; tile += kTile) {
    // Bit k: token first + k goes to local rank j (one register, not the masks: the cap's
    // test in the loop below then fits in 64 registers without a spill).
    uint32_t hit_bits = 0;
    const int64_t first = tile + int64_t(threadIdx.x) * kItemsPerThread;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      const uint64_t mask = first + k < tokens ? p.dest_masks[first + k] : 0;
      hit_bits |= uint32_t((mask >> j) & 1) << k;
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
        const uint32_t* bits = p.routing + i * p.routing_words;
        bool* out = p.local_expert_routing_map + int64_t(row) * E;
        for (int e = 0; e < E; ++e) out[e] = routing_bit(bits, d.local_rank * E + e);
      }
      row += int(hit);
    }
    __syncthreads();  // everyone read `running` before it moves on
    if (threadIdx.x == 0) running = base + tile_total;
    __syncthreads();
  }
  // Rows routed to local rank j before the cap: every rank of the domain scans the same masks,
  // so a blocking call past the cap grows on every rank of the domain together.
  if (threadIdx.x == 0) p.summary->routed[j] = running;
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
