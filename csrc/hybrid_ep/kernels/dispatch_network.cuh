// The dispatch's network role (several domains): this rank's own chunks go to the peer of
// every other domain, into the ring that peer keeps for this domain, which it forwards inside
// its domain (dispatch.cu's loader and store warps, docs/multi-domain.md).
#pragma once

#include "hybrid_ep/kernels/common/domains.cuh"
#include "hybrid_ep/kernels/common/ring_credits.cuh"
#include "hybrid_ep/kernels/network_send.cuh"
#include "hybrid_ep/kernels/network_send_eager.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {

// Network warp `w` of `warps` (several domains): its share of this block's (chunk, other domain)
// pairs, the runs of this rank's tokens of the chunk that go to that domain's peer, on channel
// blockIdx.x % channels. Chunk c waits for the credit of chunk c - K (its slot's previous
// chunk); a wait that timed out sends all the same, so that the receiver does not hang. In the
// eager form (p.eager) the chunk goes as records in tiles, signalled with `epoch`'s values, and
// every network warp of the block sends each pair together (`crew`, its share of the tiles).
inline __device__ void send_own_chunks(const DispatchParams& p, uint64_t epoch, TokenRun* runs,
                                       const EagerCrew& crew, int lane) {
  const int w = crew.warp, warps = crew.warps;
  const DomainView& d = p.domain;
  const int T = p.max_tokens;
  const int K = p.ring_chunks;
  const int tokens = min(p.num_tokens, T);
  const int channel = blockIdx.x % p.channels;
  const int others = d.nodes - 1;
  const int my_chunks =
      (p.max_chunks - int(blockIdx.x) + p.dispatch_blocks - 1) / p.dispatch_blocks;
  const int first_pair = p.eager ? 0 : w, pair_step = p.eager ? 1 : warps;
  for (int pair = first_pair; pair < my_chunks * others; pair += pair_step) {
    const int c = blockIdx.x + (pair / others) * p.dispatch_blocks;
    const int first = min(c * p.chunk, T), last = min(first + p.chunk, T);
    const int k = pair % others;
    const int node = other_domain(k, d.node_rank);
    // One wait per chunk (each counts the flag's expected value); in the eager form the crew's
    // barrier orders the other warps' stores after warp 0's.
    if (c >= K && (!p.eager || w == 0)) {
      wait_credit(d, p.dispatch_credits, node, c - K, WaitSite::kDispatchCredit, lane);
    }
    // Where this rank's tokens land at that peer: its ring for this domain, slot c % K.
    const int64_t base = ring_token_base(other_domain_index(d.node_rank, node), c, K, p.chunk);
    const bool* goes = p.attn_to_rdma_map + k;
    const auto selected = [&](int t) { return t < tokens && goes[int64_t(t) * others]; };
    if (p.eager) {
      const int64_t slot = int64_t(other_domain_index(d.node_rank, node)) * K + c % K;
      // A part not sent has no source (an offset from a null one would read as unaligned).
      const bool probs = p.probs != nullptr, scales = p.scales != nullptr;
      const EagerSources src{p.net_hidden,
                             probs ? reinterpret_cast<const uint8_t*>(
                                         p.restriped_probs + size_t(node) * T * p.prob_cols)
                                   : nullptr,
                             scales ? reinterpret_cast<const uint8_t*>(p.net_scales_src) : nullptr,
                             p.row_bytes,
                             probs ? int(p.prob_cols * sizeof(float)) : 0,
                             scales ? int(p.scale_cols * sizeof(float)) : 0};
      const size_t remote = p.net_rows + size_t(slot * p.eager_slot_bytes);
      // Not mapped: this rank's staging ring is by destination (the receiver's is by sender).
      const int64_t staged = int64_t(other_domain_index(node, d.node_rank)) * K + c % K;
      uint8_t* peer = TransportDevice::mapped(p.transport, node);
      const EagerTarget target =
          peer != nullptr ? EagerTarget{peer + remote, false, node, remote}
                          : EagerTarget{d.self() + p.eager_staging + staged * p.eager_slot_bytes,
                                        true, node, remote};
      send_chunk_eager(p.transport, channel, target, selected, first, last, src,
                       eager_signal_value(epoch, uint32_t(c)), reinterpret_cast<int*>(runs), crew,
                       lane);
      continue;
    }
    const NetTensor tensors[kMaxNetTensors] = {
        {p.net_hidden, p.net_rows + size_t(base * p.row_bytes), p.row_bytes},
        {reinterpret_cast<const uint8_t*>(p.restriped_probs + size_t(node) * T * p.prob_cols),
         p.net_probs + size_t(base * p.prob_cols * int64_t(sizeof(float))),
         p.probs != nullptr ? int(p.prob_cols * sizeof(float)) : 0, p.prob_puts_per_token},
        {reinterpret_cast<const uint8_t*>(p.net_scales_src),
         p.net_scales + size_t(base * p.scale_cols * int64_t(sizeof(float))),
         p.scales != nullptr ? int(p.scale_cols * sizeof(float)) : 0}};
    send_chunk(p.transport, channel, node, selected, first, last, tensors,
               p.network_flags.slot(d.node_rank, c), runs, lane);
  }
  // The sources (this call's rows) may be reused once the kernel ends.
  TransportDevice::flush(p.transport, channel, lane);
}

}  // namespace hybrid_ep
