// The dispatch's walk (dispatch.cu): which chunks a block forwards and in what order, where
// each chunk's rows are read (the caller's tensors, or the ring a peer's chunk landed in), and
// whether a peer's chunk has arrived.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring_credits.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {

struct ChunkRange {
  int first, last;
};

// Tokens of chunk c of domain `node`: of this rank's own, or of the T of that domain's peer.
__device__ __forceinline__ ChunkRange chunk_range(const DispatchParams& p, int node, int c) {
  const int tokens = node == p.domain.node_rank ? min(p.num_tokens, p.max_tokens) : p.max_tokens;
  return {min(c * p.chunk, tokens), min((c + 1) * p.chunk, tokens)};
}

// Where token t of domain `node` is read: the caller's tensors for this rank's own tokens,
// the ring for a peer's (their probs hold only this domain's E*R columns already).
struct RowSource {
  const uint8_t* rows;
  const float* probs;  // token t's E*R columns at probs + t * prob_stride
  const float* scales;
  int64_t prob_stride;
  const int32_t* routes;  // sparse_to_dense_map rows of this domain's forwarded tokens
};

// Chunk c of domain `node`: a peer's chunk is read from the ring this rank keeps for that
// domain, slot c % K (dispatch_network.cuh's ring_token_base); in the eager form `rows` is the
// slot itself.
__device__ __forceinline__ RowSource row_source(const DispatchParams& p, int node, int c) {
  const int64_t first = int64_t(node) * p.max_tokens;
  const int32_t* routes = p.sparse_to_dense_map + first * p.domain.ranks;
  if (node == p.domain.node_rank) {
    return {p.hidden, p.probs != nullptr ? p.probs + p.prob_col_offset : nullptr, p.scales,
            p.experts_total, routes};
  }
  const uint8_t* self = p.domain.self();
  const int other = other_domain_index(node, p.domain.node_rank);
  if (p.eager) {  // records in tiles (dispatch_eager.cuh), not rows by token
    const int64_t slot = int64_t(other) * p.ring_chunks + c % p.ring_chunks;
    return {self + p.net_rows + slot * p.eager_slot_bytes, nullptr, nullptr, 0, routes};
  }
  const int64_t base = ring_token_base(other, c, p.ring_chunks, p.chunk);
  return {self + p.net_rows + base * p.row_bytes,
          p.probs != nullptr
              ? reinterpret_cast<const float*>(self + p.net_probs) + base * p.prob_cols
              : nullptr,
          p.scales != nullptr
              ? reinterpret_cast<const float*>(self + p.net_scales) + base * p.scale_cols
              : nullptr,
          p.prob_cols, routes};
}

// The chunks a dispatch block forwards, in the order its loader and store warps walk them:
// this rank's own chunks c = b, b + blocks, ... first (they need no wait), then its share of
// the other domains' chunks, chunk by chunk: pair q = c * (N - 1) + k (chunk c of the k-th
// other domain) is block q % blocks's, taken in ascending q. Taking one domain's chunks all
// before the next domain's, a receiver could wait for a sender that waits for its credit (rings
// shallower than the chunks, three or more domains: docs/multi-domain.md, "Rings"); spreading a
// chunk's domains over the blocks, a ring of one slot per domain still keeps every block busy.
struct WalkItem {
  int node, c;
};

struct DispatchWalk {
  int own;    // this block's own chunks
  int items;  // and its pairs after them

  __device__ static DispatchWalk of(const DispatchParams& p) {
    const int b = blockIdx.x, blocks = p.dispatch_blocks;
    const int own = (p.max_chunks - b + blocks - 1) / blocks;
    const int pairs = p.max_chunks * (p.domain.nodes - 1);
    return {own, own + (pairs - b + blocks - 1) / blocks};
  }
  __device__ WalkItem at(const DispatchParams& p, int k) const {
    const DomainView& d = p.domain;
    const int b = blockIdx.x, blocks = p.dispatch_blocks;
    if (k < own) return {d.node_rank, b + k * blocks};
    const int others = d.nodes - 1, q = b + (k - own) * blocks;
    return {(d.node_rank + 1 + q % others) % d.nodes, q / others};
  }
};

// Lane 0 of the loader: whether chunk c from the peer of `node` has arrived (always true for
// this rank's own chunks). False after a timeout: the chunk is then passed on unloaded so that
// the store warps still finish (the buffer is unusable after a failed wait anyway).
inline __device__ bool chunk_arrived(const DispatchParams& p, int node, int c) {
  const DomainView& d = p.domain;
  if (node == d.node_rank || p.eager) return true;  // eager: tile by tile (dispatch_eager.cuh)
  const size_t slot = p.network_flags.slot(node, c);
  return wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d,
                   WaitSite::kNetworkFlag, node, c);
}

}  // namespace hybrid_ep
