// Combine between NVLink domains (CombineParams::partial; docs/multi-domain.md, "Combine"), in
// the one persistent combine grid. Block b walks the forwarded token space chunk by chunk
// (ChunkWalk): its share of every other domain's chunk c (their partials leave over the
// network), and `lag` chunks behind, the in-domain sums and then the final sums of its own
// chunks (they need the other domains' partials, which arrive meanwhile). The
// partials between domains travel through rings (kernels/common/ring_credits.cuh): a chunk's
// partials for domain n are written once n credited chunk c - K back.
//   reduce warps  (combine.cu): each token's in-domain sum becomes a partial, rounded once to
//                  the wire's width (BF16 by default, fp32 on request), and the warp counts the
//                  chunk done. A partial for a peer mapped into this process (one host, NVLink:
//                  TransportDevice::mapped) is stored straight into that peer's ring slot;
//   network warps (send_reduced_chunks): as soon as a chunk of another domain is reduced, one
//                  put per run of the tokens that came here (partials, then their probs) to
//                  that domain's peer -- for a mapped peer, whose data is there already, only
//                  counted -- and one signal per (chunk, peer), also when nothing came;
//   final pass    (combine.cu, the loader and reduce warps again, through the same ring): per
//                  own chunk, once this block's partials of it are written and every other
//                  domain's flag of it is in, the loader TMA-loads each token's partials of
//                  the domains it went to, and the reduce warps add them in fp32 in ascending
//                  domain order into the BF16 output; combined_probs takes each domain's E*R
//                  columns from that domain's partial; then the chunk is credited back to every
//                  other domain.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/combine_eager.cuh"
#include "hybrid_ep/kernels/combine_sum.cuh"
#include "hybrid_ep/kernels/combine_walk.cuh"
#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/common/chunk_routes.cuh"
#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/common/ring_credits.cuh"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {
namespace combine {

// Network warp `w` of `warps`: this block's chunks of other domains (sent items w, w + warps,
// ...), each once every one of the block's `reduce_warps` has counted it done in `reduced`
// (they finish chunks in order).
__device__ __forceinline__ void send_reduced_chunks(const CombineParams& p, const ChunkWalk& walk,
                                                    const volatile uint32_t* reduced,
                                                    int reduce_warps, TokenRun* runs, int w,
                                                    int warps, int lane) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  const int T = a.max_tokens;
  const int channel = blockIdx.x % a.channels;
  const int64_t row_bytes = int64_t(partial_row_bytes(p));
  const int64_t prob_bytes = int64_t(p.prob_cols) * int64_t(sizeof(float));
  const uint8_t* self = d.self();
  for (int i = w; i < walk.pairs; i += warps) {
    const int k = walk.sent_item(p, i);
    const ChunkItem it = walk.pair_item(p, i);
    while (*reduced < uint32_t(reduce_warps * (k + 1)) && !d.aborted()) __nanosleep(64);
    __threadfence();  // the partials the reduce warps wrote, before this warp reads them
    const bool stored = TransportDevice::mapped(a.transport, it.node) != nullptr;
    const bool* came = a.rdma_to_attn_map + it.node;
    const auto selected = [&](int t) { return came[int64_t(t) * d.nodes]; };
    // By token t of the chunk: this rank's ring slot for that domain (after its own T rows),
    // and the slot of this domain's ring at the peer.
    const int64_t from =
        T + ring_token_base(other_domain_index(it.node, d.node_rank), it.c, a.ring_chunks, p.chunk);
    const int64_t to =
        ring_token_base(other_domain_index(d.node_rank, it.node), it.c, a.ring_chunks, p.chunk);
    const NetTensor tensors[kMaxNetTensors] = {
        {self + a.partials_at + from * row_bytes, a.net_partials + size_t(to * row_bytes),
         int(row_bytes)},
        {self + a.partial_probs_at + from * prob_bytes,
         a.net_partial_probs + size_t(to * prob_bytes),
         a.partial_probs != nullptr ? int(prob_bytes) : 0},
        {nullptr, 0, 0}};
    const int first = it.first - it.node * T;
    send_chunk(a.transport, channel, it.node, selected, first, first + (it.last - it.first),
               tensors, a.combine_flags.slot(d.node_rank, it.c), runs, lane, stored);
  }
  TransportDevice::flush(a.transport, channel, lane);  // the partials are rewritten next call
}

// Where the reduce warps write the partials of chunk `it`: this rank's own tokens' into the own
// rows of `partials`; another domain's into the ring slot of this domain at that domain's peer
// where it is mapped into this process (the put is then only counted; in the eager form as the
// chunk's records in tiles, combine_eager.cuh), else into this rank's ring slot for that domain
// (the put's source).
struct PartialTarget {
  uint8_t* rows;  // row of forwarded token i at rows + (i - first_token) * partial_row_bytes
  float* probs;   // likewise, prob_cols each; null without probs
  int first_token;
  // The eager form: `rows` is the peer's slot (or this rank's staging slot for it), token i's
  // record is records[i - first_token] (number_records), of record.record bytes.
  const int32_t* records = nullptr;
  EagerPayload record{};

  // Records in the eager form's tiles (another domain's slot), not rows.
  __device__ bool tiled() const { return records != nullptr; }
  // The eager form: token i's partial from byte `offset` on, and its probs.
  __device__ TiledRow record_row(int i, int64_t offset) const {
    return {rows, record.row_at(records[i - first_token]) + offset};
  }
  __device__ TiledRow record_probs(int i) const {
    return {rows, record.row_at(records[i - first_token]) + record.probs_at};
  }
};

// `records`: the reduce warps' numbering of the chunk's tokens (the eager form).
__device__ __forceinline__ PartialTarget partial_target(const CombineParams& p, const ChunkItem& it,
                                                        const int32_t* records) {
  const CombineAcross& a = p.across;
  const DomainView& d = p.domain;
  const int64_t row_bytes = int64_t(partial_row_bytes(p));
  const int64_t T = a.max_tokens;
  if (it.node == d.node_rank) return {a.partials, a.partial_probs, int(d.node_rank * T)};
  uint8_t* peer = TransportDevice::mapped(a.transport, it.node);
  if (a.eager) {  // the peer's slot, or (not mapped) this rank's staging slot for it
    uint8_t* slot = peer != nullptr ? eager_slot(p, peer + a.net_partials,
                                                 other_domain_index(d.node_rank, it.node), it.c)
                                    : eager_staging_slot(p, it.node, it.c);
    PartialTarget target{slot, a.partial_probs, it.first, records};
    target.record = eager_partials(p, 1);
    return target;
  }
  const int first = it.node * int(T) + it.c * p.chunk;  // the slot's first token
  int64_t row;
  uint8_t* rows;
  float* probs;
  if (peer != nullptr) {
    row = ring_slot_row(other_domain_index(d.node_rank, it.node), it.c, a.ring_chunks, p.chunk);
    rows = peer + a.net_partials;
    probs = reinterpret_cast<float*>(peer + a.net_partial_probs);
  } else {
    row = T + ring_slot_row(other_domain_index(it.node, d.node_rank), it.c, a.ring_chunks, p.chunk);
    rows = a.partials;
    probs = a.partial_probs;
  }
  return {rows + row * row_bytes, a.partial_probs == nullptr ? nullptr : probs + row * p.prob_cols,
          first};
}

// The reduce warps before writing the partials of chunk `it` of another domain: that domain
// has credited chunk c - K back (warp 0 waits; the caller's barrier holds the others).
__device__ __forceinline__ void wait_partial_slot(const CombineParams& p, const ChunkItem& it,
                                                  int lane) {
  const CombineAcross& a = p.across;
  if (it.node == p.domain.node_rank || it.c < a.ring_chunks) return;
  wait_credit(p.domain, a.combine_credits, it.node, it.c - a.ring_chunks, WaitSite::kCombineCredit,
              lane);
}

// A reduce warp done with its share of the final pass of own chunk c, the block's `ordinal`-th
// (it has read every partial it needed): the last warp in credits the chunk back to every other
// domain. `finals` counts the warps in; no warp waits for the others.
__device__ __forceinline__ void credit_partials(const CombineParams& p, uint32_t* finals,
                                                int reduce_warps, int ordinal, int c, int lane) {
  const CombineAcross& a = p.across;
  // Own chunks come in ascending c, so those past the last credited one are the block's last.
  if (!credit_flows(a.ring_chunks, a.max_chunks, c)) return;
  bool last = false;
  if (lane == 0) {
    __threadfence_block();
    last = atomicAdd(finals, 1u) == uint32_t(reduce_warps * (ordinal + 1) - 1);
  }
  if (!__shfl_sync(~0u, last, 0) || a.withhold_credits) return;
  const DomainView& d = p.domain;
  for (int k = 0; k < d.nodes - 1; ++k) {
    TransportDevice::signal(a.control, blockIdx.x % a.channels, other_domain(k, d.node_rank),
                            a.combine_credits.slot(d.node_rank, c), 1, lane);
  }
}

// Row of this rank's token t's partial from domain n in what partial_source(p, n) points at:
// the own rows of `partials`, or the ring slot of n's chunk of t.
__device__ __forceinline__ int64_t partial_row(const CombineParams& p, int n, int t) {
  if (n == p.domain.node_rank) return t;
  return ring_token_base(other_domain_index(n, p.domain.node_rank), t / p.chunk,
                         p.across.ring_chunks, p.chunk) +
         t;
}

// Whether token t of this rank has a partial from domain n: whether it went there.
__device__ __forceinline__ bool partial_present(const CombineParams& p, int n, int t) {
  const DomainView& d = p.domain;
  if (n == d.node_rank) return p.across.rdma_to_attn_map[int64_t(t) * d.nodes + n];
  return p.across.attn_to_rdma_map[int64_t(t) * (d.nodes - 1) + other_domain_index(n, d.node_rank)];
}

// Where the final pass reads domain n's partials of this rank's tokens: this domain's own
// (written by this block's first pass), or the ring domain n's peer put them in. Row of token
// t: partial_row(p, n, t).
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
  // The eager form waits per token instead (EagerPartials).
  for (int k = 0; k < (a.eager ? 0 : d.nodes - 1); ++k) {
    const int n = other_domain(k, d.node_rank);
    const size_t slot = a.combine_flags.slot(n, c);
    wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d,
              WaitSite::kNetworkCombine, n, c);
  }
  __threadfence();
  ptx::fence_proxy_async_global();
}

// The final pass's routes of tokens [first, last) into `routes` ([tokens, nodes]): entry n of
// token t is its partial's row partial_row(p, n, t) where the token went to domain n, else -1 (by
// `threads` threads; the caller synchronises).
__device__ __forceinline__ void stage_partial_routes(const CombineParams& p,
                                                     const ChunkRoutes& routes, int first, int last,
                                                     int thread, int threads) {
  const int nodes = p.domain.nodes;
  for (int i = thread; i < (last - first) * nodes; i += threads) {
    const int t = first + i / nodes;
    const int n = i % nodes;
    routes.rows[i] = partial_present(p, n, t) ? int32_t(partial_row(p, n, t)) : -1;
  }
}

// combined_probs of this rank's token t of own chunk c: each domain's E*R columns from that
// domain's partial probs (zero where the token did not go). Peers' partial probs are read from
// L2: they were written by other processes, never cached here. `rows`: the token's staged
// routes (in the eager form another domain's entry is the token's record there).
template <bool kEager>
__device__ __forceinline__ void write_final_probs(const CombineParams& p, int t, int c,
                                                  const int32_t* rows, int thread, int threads) {
  const CombineAcross& a = p.across;
  const int cols = p.domain.nodes * p.prob_cols;
  for (int col = thread; col < cols; col += threads) {
    const int n = col / p.prob_cols;
    float value = 0.f;
    if (a.partial_probs != nullptr && rows[n] >= 0) {
      const int64_t at = partial_row(p, n, t) * p.prob_cols + col % p.prob_cols;
      if (n == p.domain.node_rank) {
        value = a.partial_probs[at];
      } else if (kEager) {
        value = eager_final_prob(p, n, c, rows[n], col % p.prob_cols);
      } else {
        value = __ldcg(reinterpret_cast<const float*>(p.domain.self() + a.net_partial_probs) + at);
      }
    }
    p.out_probs[int64_t(t) * cols + col] = value;
  }
}

}  // namespace combine
}  // namespace hybrid_ep
