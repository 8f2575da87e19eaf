// Combine between NVLink domains (CombineParams::partial; docs/multi-domain.md, "Combine"), in
// the one persistent combine grid. Block b walks its chunks of the forwarded token space domain
// by domain: the other domains' first (their partials leave over the network), this rank's own
// last (their final sums need the other domains' partials, which arrive meanwhile).
//   reduce warps  (combine.cu): each token's in-domain sum becomes a partial, rounded once to
//                  the wire's width (BF16 by default, fp32 on request), and the warp counts the
//                  chunk done. A partial for a peer mapped into this process (one host, NVLink:
//                  TransportDevice::mapped) is stored straight into that peer's receive tile;
//   network warps (send_reduced_chunks): as soon as a chunk of another domain is reduced, one
//                  put per run of the tokens that came here (partials, then their probs) to
//                  that domain's peer -- for a mapped peer, whose data is there already, only
//                  counted -- and one signal per (chunk, peer), also when nothing came;
//   final pass    (combine.cu, the loader and reduce warps again, through the same ring): per
//                  own chunk, once this block's partials of it are written and every other
//                  domain's flag of it is in, the loader TMA-loads each token's partials of
//                  the domains it went to, and the reduce warps add them in fp32 in ascending
//                  domain order into the BF16 output; combined_probs takes each domain's E*R
//                  columns from that domain's partial.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace combine {

// A chunk of the forwarded token space: tokens [first, last) (n * T + t with several
// domains), chunk c of domain `node`.
struct ChunkItem {
  int node;
  int c;
  int first, last;
};

// The chunks block blockIdx.x walks, in the order every role of the block walks them.
struct ChunkWalk {
  int items;       // of this block
  int per_domain;  // with several domains: this block's chunks of each domain

  __device__ static ChunkWalk of(const CombineParams& p) {
    const int b = blockIdx.x, blocks = p.combine_blocks;
    if (!p.partial) {
      const int chunks = (p.num_tokens + p.chunk - 1) / p.chunk;
      return {max(0, (chunks - b + blocks - 1) / blocks), 0};
    }
    const int per = max(0, (p.across.max_chunks - b + blocks - 1) / blocks);
    return {p.domain.nodes * per, per};
  }

  __device__ ChunkItem at(const CombineParams& p, int k) const {
    const int b = blockIdx.x, blocks = p.combine_blocks;
    if (!p.partial) {
      const int c = b + k * blocks;
      const int first = c * p.chunk;
      return {p.domain.node_rank, c, first, min(first + p.chunk, p.num_tokens)};
    }
    const int node = (p.domain.node_rank + 1 + k / per_domain) % p.domain.nodes;
    const int c = b + (k % per_domain) * blocks;
    const int T = p.across.max_tokens;
    return {node, c, node * T + c * p.chunk, node * T + min((c + 1) * p.chunk, T)};
  }

  // Items k < sent() are other domains' chunks, whose partials go over the network.
  __device__ int sent(const CombineParams& p) const {
    return p.partial ? (p.domain.nodes - 1) * per_domain : 0;
  }
};

__host__ __device__ __forceinline__ size_t partial_row_bytes(const CombineParams& p) {
  return size_t(p.hidden) * (p.across.bf16_wire ? 2 : 4);
}

// Network warp `w` of `warps`: this block's chunks of other domains w, w + warps, ..., each
// once every one of the block's `reduce_warps` has counted it done in `reduced` (they finish
// chunks in order).
__device__ __forceinline__ void send_reduced_chunks(const CombineParams& p, const ChunkWalk& walk,
                                                    const volatile uint32_t* reduced,
                                                    int reduce_warps, TokenRun* runs, int w,
                                                    int warps, int lane) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  const int T = a.max_tokens;
  const int channel = blockIdx.x % a.channels;
  const size_t row_bytes = partial_row_bytes(p);
  const size_t prob_bytes = size_t(p.prob_cols) * sizeof(float);
  const size_t tile = size_t(d.node_rank) * T;  // where this domain's partials land at a peer
  const uint8_t* self = d.self();
  for (int k = w; k < walk.sent(p); k += warps) {
    const ChunkItem it = walk.at(p, k);
    while (*reduced < uint32_t(reduce_warps * (k + 1)) && !d.aborted()) __nanosleep(64);
    __threadfence();  // the partials the reduce warps wrote, before this warp reads them
    const bool stored = TransportDevice::mapped(a.transport, it.node) != nullptr;
    const bool* came = a.rdma_to_attn_map + it.node;
    const auto selected = [&](int t) { return came[int64_t(t) * d.nodes]; };
    const size_t from = size_t(it.node) * T;  // the peer's tokens in this rank's partials
    const NetTensor tensors[kMaxNetTensors] = {
        {self + a.partials_at + from * row_bytes, a.net_partials + tile * row_bytes,
         int(row_bytes)},
        {self + a.partial_probs_at + from * prob_bytes, a.net_partial_probs + tile * prob_bytes,
         a.partial_probs != nullptr ? int(prob_bytes) : 0},
        {nullptr, 0, 0}};
    send_chunk(a.transport, channel, it.node, selected, it.first - int(from), it.last - int(from),
               tensors, a.combine_flags.slot(d.node_rank, it.c), runs, lane, stored);
  }
  TransportDevice::flush(a.transport, channel, lane);  // the partials are rewritten next call
}

// Where the reduce warps write the partials of chunk `it`: for another domain's peer mapped into
// this process its receive tile (the put is then only counted), else this rank's partials.
struct PartialTarget {
  uint8_t* rows;  // row of forwarded token i at rows + (i - first_token) * partial_row_bytes
  float* probs;   // likewise, prob_cols each; null without probs
  int first_token;
};

__device__ __forceinline__ PartialTarget partial_target(const CombineParams& p,
                                                        const ChunkItem& it) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  const size_t row_bytes = partial_row_bytes(p);
  uint8_t* peer = it.node == d.node_rank ? nullptr : TransportDevice::mapped(a.transport, it.node);
  if (peer == nullptr) return {a.partials, a.partial_probs, 0};
  const size_t tile = size_t(d.node_rank) * a.max_tokens;  // this domain's rows at the peer
  float* probs = a.partial_probs == nullptr
                     ? nullptr
                     : reinterpret_cast<float*>(peer + a.net_partial_probs) + tile * p.prob_cols;
  return {peer + a.net_partials + tile * row_bytes, probs, it.node * a.max_tokens};
}

// Whether token t of this rank has a partial from domain n: whether it went there.
__device__ __forceinline__ bool partial_present(const CombineParams& p, int n, int t) {
  const DomainView& d = p.domain;
  if (n == d.node_rank) return p.across.rdma_to_attn_map[int64_t(t) * d.nodes + n];
  return p.across.attn_to_rdma_map[int64_t(t) * (d.nodes - 1) + other_domain_index(n, d.node_rank)];
}

// Where the final pass reads domain n's partials of this rank's tokens: this domain's own
// (written by this block's first pass), or what domain n's peer put here. Row of token t:
// n * T + t.
__device__ __forceinline__ const uint8_t* partial_source(const CombineParams& p, int n) {
  if (n == p.domain.node_rank) return p.across.partials;
  return p.domain.self() + p.across.net_partials;
}

// Own chunk k of the final pass: chunk c = blockIdx.x + k * blocks of this rank's tokens
// [first, last) (empty past its tokens; its flags are consumed all the same).
struct OwnChunk {
  int c;
  int first, last;
};

__device__ __forceinline__ OwnChunk own_chunk(const CombineParams& p, int k) {
  const int c = int(blockIdx.x) + k * p.combine_blocks;
  const int first = min(c * p.chunk, p.across.out_tokens);
  return {c, first, min(first + p.chunk, p.across.out_tokens)};
}

// Lane 0 of the loader before the final pass loads chunk c: this block's own partials of it
// are written (`reduced` reached `done`: every reduce warp counted it) and every other domain's
// flag of it is in. The TMA loads that follow read what both published.
__device__ __forceinline__ void wait_partials(const CombineParams& p, const uint32_t* reduced,
                                              uint32_t done, int c) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  while (*static_cast<const volatile uint32_t*>(reduced) < done && !d.aborted()) __nanosleep(64);
  for (int k = 0; k < d.nodes - 1; ++k) {
    const int n = other_domain(k, d.node_rank);
    const size_t slot = a.combine_flags.slot(n, c);
    wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d,
              WaitSite::kNetworkCombine, n, c);
  }
  __threadfence();
  ptx::fence_proxy_async_global();
}

// The final pass's routes of tokens [first, last) into `routes` ([tokens, nodes]): entry n of
// token t is its partial's row n * T + t where the token went to domain n, else -1 (by
// `threads` threads; the caller synchronises).
__device__ __forceinline__ void stage_partial_routes(const CombineParams& p,
                                                     const ChunkRoutes& routes, int first, int last,
                                                     int thread, int threads) {
  const int nodes = p.domain.nodes;
  const int T = p.across.max_tokens;
  for (int i = thread; i < (last - first) * nodes; i += threads) {
    const int t = first + i / nodes;
    const int n = i % nodes;
    routes.rows[i] = partial_present(p, n, t) ? n * T + t : -1;
  }
}

// combined_probs of this rank's token t: each domain's E*R columns from that domain's partial
// probs (zero where the token did not go). Peers' partial probs are read from L2: they were
// written by other processes, never cached here.
__device__ __forceinline__ void write_final_probs(const CombineParams& p, int t, int thread,
                                                  int threads) {
  const CombineAcross& a = p.across;
  const int cols = p.domain.nodes * p.prob_cols;
  for (int col = thread; col < cols; col += threads) {
    const int n = col / p.prob_cols;
    float value = 0.f;
    if (a.partial_probs != nullptr && partial_present(p, n, t)) {
      const size_t at = (size_t(n) * a.max_tokens + t) * p.prob_cols + col % p.prob_cols;
      value =
          n == p.domain.node_rank
              ? a.partial_probs[at]
              : __ldcg(reinterpret_cast<const float*>(p.domain.self() + a.net_partial_probs) + at);
    }
    p.out_probs[int64_t(t) * cols + col] = value;
  }
}

}  // namespace combine
}  // namespace hybrid_ep
