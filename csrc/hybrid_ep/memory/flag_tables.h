// The flag tables of the registered buffer (memory/layout.h places them): one monotonic uint64
// flag per index, row-major. slot() is a flag's region offset, the same in every rank's buffer:
// a peer's flag is at its base + slot, and this rank's consumer counter of it is
// DomainView::expected_for(slot). The layout sizes each region from its table (bytes()); the
// kernels get the tables in their params and name a flag by its indices, nowhere by arithmetic.
// A call over fewer tokens than the buffer holds strides its chunk tables by its own chunk count
// (with_chunks), the same on every rank of the call.
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for the host compiler

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

// A fused unpermute's unit, the dispatch rows of one (source, chunk), is split into this many
// slices, each its own work item and flag: a chunk's rows spread over several blocks.
constexpr int kUnpermuteSlices = 4;

constexpr size_t kFlagBytes = sizeof(uint64_t);

// [R]: one flag per local rank. barrier_flags: the rank that signalled (the domain barrier and
// the routing all-gather); forward_flags: the rank that forwarded the other domains' maps.
struct RankFlags {
  size_t at = 0;  // region offset
  int ranks = 0;
  __host__ __device__ size_t slot(int rank) const { return at + kFlagBytes * size_t(rank); }
  __host__ __device__ size_t bytes() const { return kFlagBytes * size_t(ranks); }
};

// [N]: one flag per domain, the peer there that signalled (net_barrier_flags).
struct DomainFlags {
  size_t at = 0;
  int nodes = 0;
  __host__ __device__ size_t slot(int node) const { return at + kFlagBytes * size_t(node); }
  __host__ __device__ size_t bytes() const { return kFlagBytes * size_t(nodes); }
};

// [N, C]: one flag per chunk from the peer of each domain. network_flags: the dispatch's chunks
// of that peer's tokens (and the transport checks, chunk 0); combine_flags: the partials of this
// rank's tokens that domain reduced; dispatch_credits and combine_credits: that peer consumed
// the ring slot of this rank's chunk c (its rows; its partials).
struct ChunkFlags {
  size_t at = 0;
  int nodes = 0, chunks = 0;
  __host__ __device__ size_t slot(int node, int chunk) const {
    return at + kFlagBytes * (size_t(node) * chunks + size_t(chunk));
  }
  __host__ __device__ size_t bytes() const { return kFlagBytes * size_t(nodes) * chunks; }
  ChunkFlags with_chunks(int c) const { return {at, nodes, c}; }
};

// [R, N, C]: dispatch_flags, one per chunk a local rank forwarded to this one: (forwarding
// local rank, domain of the chunk's tokens, chunk).
struct DispatchFlags {
  size_t at = 0;
  int ranks = 0, nodes = 0, chunks = 0;
  __host__ __device__ size_t slot(int rank, int node, int chunk) const {
    return at + kFlagBytes * ((size_t(rank) * nodes + size_t(node)) * chunks + size_t(chunk));
  }
  __host__ __device__ size_t count() const { return size_t(ranks) * nodes * chunks; }
  __host__ __device__ size_t bytes() const { return kFlagBytes * count(); }
  // Flag k in slot order, for walks over the whole table.
  __host__ __device__ size_t nth(size_t k) const { return at + kFlagBytes * k; }
  DispatchFlags with_chunks(int c) const { return {at, ranks, nodes, c}; }
};

// [R, N, C, S]: unpermute_flags, one per slice of a fused unpermute's unit that a local rank
// unpermuted for this one: (producing local rank, domain, chunk, slice).
struct UnpermuteFlags {
  size_t at = 0;
  int ranks = 0, nodes = 0, chunks = 0, slices = kUnpermuteSlices;
  __host__ __device__ size_t slot(int rank, int node, int chunk, int slice) const {
    const size_t unit = (size_t(rank) * nodes + size_t(node)) * chunks + size_t(chunk);
    return at + kFlagBytes * (unit * slices + size_t(slice));
  }
  __host__ __device__ size_t count() const { return size_t(ranks) * nodes * chunks * slices; }
  __host__ __device__ size_t bytes() const { return kFlagBytes * count(); }
  __host__ __device__ size_t nth(size_t k) const { return at + kFlagBytes * k; }
  UnpermuteFlags with_chunks(int c) const { return {at, ranks, nodes, c, slices}; }
};

// Every flag table of a buffer.
struct FlagTables {
  RankFlags barrier, forward;
  DispatchFlags dispatch;
  UnpermuteFlags unpermute;
  ChunkFlags network, combine;
  ChunkFlags dispatch_credits, combine_credits;
  DomainFlags net_barrier;

  // The tables' shapes for R ranks per domain, N domains and C chunks per domain (offsets 0).
  static FlagTables shaped(int ranks, int nodes, int chunks) {
    FlagTables t;
    t.barrier.ranks = t.forward.ranks = ranks;
    t.dispatch = {0, ranks, nodes, chunks};
    t.unpermute = {0, ranks, nodes, chunks, kUnpermuteSlices};
    t.network = t.combine = t.dispatch_credits = t.combine_credits = {0, nodes, chunks};
    t.net_barrier.nodes = nodes;
    return t;
  }
};

}  // namespace hybrid_ep
