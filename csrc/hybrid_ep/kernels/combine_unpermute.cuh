// The unpermute role of the fused combine_with_unpermute (fuse_unpermute_combine), and the
// combine loader's wait for it.
//   unpermute blocks : every block of the combine grid inside one domain (before it combines),
//                      the blocks past the combine blocks with several domains. Work item q is
//                      one slice of (domain n, chunk c, local rank l): the dispatch rows of
//                      source n * R + l's chunk c (the handle's dense_chunk_layout), one warp
//                      per row; then the slice is signalled to local rank l, the only rank that
//                      pulls those rows. Items go in forwarded-token order, as combine chunks
//                      are processed.
//   loader (lane 0)  : before a chunk's copies, waits until every local rank signalled every
//                      slice of the units of the chunk's tokens.
// Several combine blocks wait for one unit, so the waits only read the consumer counters;
// advance_unpermute_expected moves them on after the kernel.
#pragma once

#include "hybrid_ep/kernels/common/flags.cuh"
#include "hybrid_ep/kernels/params.h"
#include "hybrid_ep/kernels/unpermute_row.cuh"

namespace hybrid_ep {

// Every thread of a block of the unpermute role.
inline __device__ void unpermute_units(const CombineParams& p, int block) {
  const FusedUnpermuteParams& u = p.unpermute;
  const DomainView& d = p.domain;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const int slices = u.flags.slices;
  const int items = d.nodes * u.max_chunks * d.ranks * slices;
  const int slice_rows = (u.dispatch_chunk + slices - 1) / slices;
  for (int q = block; q < items; q += p.unpermute_blocks) {
    const int s = q % slices;
    const int l = (q / slices) % d.ranks;
    const int c = (q / (slices * d.ranks)) % u.max_chunks;
    const int n = q / (slices * d.ranks * u.max_chunks);
    const int64_t at = int64_t(n * d.ranks + l) * u.max_chunks + c;
    const int end = u.chunk_layout[at + 1];
    const int first = min(u.chunk_layout[at] + s * slice_rows, end);
    const int last = min(first + slice_rows, end);
    for (int i = first + warp; i < last; i += warps) unpermute_row(u.rows, i, threadIdx.x % 32);
    __syncthreads();  // the slice's rows are written
    // In the buffer of the rank that pulls the slice.
    if (threadIdx.x == 0) {
      signal_flag(reinterpret_cast<uint64_t*>(d.peer(l) + u.flags.slot(d.local_rank, n, c, s)));
    }
  }
}

// Lane 0 of the loader: waits for every slice of the units that hold forwarded tokens
// [first, last) at every local rank. False after a timeout.
inline __device__ bool wait_unpermuted(const CombineParams& p, int first, int last) {
  const FusedUnpermuteParams& u = p.unpermute;
  const DomainView& d = p.domain;
  const int T = u.max_tokens;
  const int from = (first / T) * u.max_chunks + (first % T) / u.dispatch_chunk;
  const int to = ((last - 1) / T) * u.max_chunks + ((last - 1) % T) / u.dispatch_chunk;
  bool ok = true;
  for (int v = from; v <= to && ok; ++v) {
    const int n = v / u.max_chunks;
    const int c = v % u.max_chunks;
    for (int k = 0; k < d.ranks * u.flags.slices && ok; ++k) {
      const int j = k / u.flags.slices;
      const size_t slot = u.flags.slot(j, n, c, k % u.flags.slices);
      ok = wait_until(reinterpret_cast<const uint64_t*>(d.self() + slot), *d.expected_for(slot) + 1,
                      d, WaitSite::kUnpermuteChunk, j, v);
    }
  }
  ptx::fence_proxy_async_global();  // the TMA loads that follow read what the flags published
  return ok;
}

}  // namespace hybrid_ep
