// The rings between domains (memory/layout.h, docs/multi-domain.md "Rings"): a receiver keeps
// K chunk slots per other domain, chunk c in slot c % K; the sender writes chunk c only once the
// receiver has credited chunk c - K back. Only a chunk whose slot a later chunk of the call
// reuses (c + K < chunks) is credited: its flag is signalled once a call (when the chunk was
// consumed) and waited for once a call (before chunk c + K is written), so the counters stay
// monotonic as the other flags'. The last K chunks send none and nobody waits for them: the
// barrier or all-gather that starts the next call already orders their slots' reuse.
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/memory/flag_tables.h"
#include "hybrid_ep/memory/layout.h"

namespace hybrid_ep {

// Whether the receiver credits chunk c back: only when chunk c + K of the same call will take its
// slot (the chunks of a call are the same every call: T is the buffer's).
__host__ __device__ __forceinline__ bool credit_flows(int ring_chunks, int chunks, int c) {
  return c + ring_chunks < chunks;
}

// Row offset that, added to token t of chunk c, gives t's row in the ring slot of chunk c of
// the domain at index `other` among the other domains (NetTensor and the row sources index by
// token): may be negative.
__host__ __device__ __forceinline__ int64_t ring_token_base(int other, int c, int ring_chunks,
                                                            int chunk) {
  return ring_slot_row(other, c, ring_chunks, chunk) - int64_t(c) * chunk;
}

// Lane 0 waits until the peer of domain `node` has credited chunk c back (its slot is free);
// every lane returns after it. A wait that timed out returns all the same (the abort word is
// set): the caller goes on so that its receivers do not hang on it.
__device__ __forceinline__ void wait_credit(const DomainView& d, const ChunkFlags& credits,
                                            int node, int c, WaitSite site, int lane) {
  if (lane == 0) {
    const size_t slot = credits.slot(node, c);
    wait_flag(reinterpret_cast<const uint64_t*>(d.self() + slot), d.expected_for(slot), d, site,
              node, c);
  }
  __syncwarp();
}

}  // namespace hybrid_ep
