// The combine's walk (combine.cu, combine_across.cuh): which chunks a block reduces and in what
// order, the same for its loader, reduce and network warps. Each role steps through it with a
// WalkCursor, one step in a few integer operations: the loader's next copies wait on nothing
// but their ring slots. (Indexed by item instead, with a search over the rounds, the walk's
// arithmetic sat between the loader's chunks: 2 x 2 combine 1561 -> 1661 us,
// benchmarks/results/2026-12-02-combine-walk.md.)
#pragma once

#include <climits>
#include <cstdint>

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

__device__ __forceinline__ int ceil_div_pos(int a, int b) { return a > 0 ? (a + b - 1) / b : 0; }

// A role's place in the walk: the block's next pair (another domain's chunk), the next own
// chunk whose in-domain sum is due, and the next own chunk whose final pass is due.
struct WalkCursor {
  int pair = 0;
  int sum = 0;
  int final = 0;
};

// One step of the walk: the in-domain sum of a first-pass chunk (`item`), or the final pass of
// own chunk `own` (OwnChunk index).
struct WalkStep {
  enum Kind { kFirst, kFinal, kDone } kind;
  ChunkItem item;
  int own;
};

// The work of block b of `blocks`. Inside one domain: its chunks c = b, b + blocks, ..., all
// first-pass. With several domains, round cc (of the C chunks) holds the block's pairs of the
// other domains' chunk cc -- pair q = cc * (N - 1) + k is block q % blocks's, so a chunk's
// domains spread over the blocks as in the dispatch -- then the in-domain sums of the own
// chunks f placed at this round (round min(f + lag, C - 1)), then their final passes. The own
// chunks wait for nothing, so they go last, where the other domains' partials have had the
// longest to arrive. A pair of chunk c waits for the credit of chunk c - K, given in its
// receiver's final pass of c - K, which follows only steps of chunks up to c - K + lag <= c - 1:
// no wait can close a cycle between ranks. The lag is a whole number of rounds of the block's
// own chunks below K (benchmarks/results/2026-12-02-net-rings.md); with every chunk in the ring
// every final pass comes after the block's last chunk.
struct ChunkWalk {
  int C;       // chunks per domain (several domains), else this block's chunks
  int lag;     // rounds an own chunk's sum and final pass trail its chunk by
  int pairs;   // the block's pairs (several domains)
  int owns;    // the block's own chunks (several domains)
  int others;  // N - 1

  __device__ static ChunkWalk of(const CombineParams& p) {
    const int b = blockIdx.x, blocks = p.combine_blocks;
    if (!p.partial) {
      const int chunks = (p.num_tokens + p.chunk - 1) / p.chunk;
      return {ceil_div_pos(chunks - b, blocks), 0, 0, 0, 0};
    }
    const int C = p.across.max_chunks;
    const int K = min(p.across.ring_chunks, C);
    const int others = p.domain.nodes - 1;
    return {C, (K - 1) / blocks * blocks, ceil_div_pos(C * others - b, blocks),
            ceil_div_pos(C - b, blocks), others};
  }

  __device__ ChunkItem item(const CombineParams& p, int node, int c) const {
    const int T = p.across.max_tokens;
    return {node, c, node * T + c * p.chunk, node * T + min((c + 1) * p.chunk, T)};
  }
  // The block's pair i: another domain's chunk.
  __device__ ChunkItem pair_item(const CombineParams& p, int i) const {
    const int q = int(blockIdx.x) + i * p.combine_blocks;
    return item(p, (p.domain.node_rank + 1 + q % others) % p.domain.nodes, q / others);
  }
  // The round own chunk j is placed at.
  __device__ int placed(const CombineParams& p, int j) const {
    return min(int(blockIdx.x) + j * p.combine_blocks + lag, C - 1);
  }

  // Steps ordered by (round, kind): a round's pairs, then its own sums, then its finals.
  __device__ int pair_key(const CombineParams& p, int i) const {
    return i < pairs ? (int(blockIdx.x) + i * p.combine_blocks) / others * 3 : INT_MAX;
  }
  __device__ int sum_key(const CombineParams& p, int j) const {
    return j < owns ? placed(p, j) * 3 + 1 : INT_MAX;
  }

  // The next first-pass item at `at` (without stepping), false at the end.
  __device__ bool next_first(const CombineParams& p, const WalkCursor& at, ChunkItem& it) const {
    if (!p.partial) {
      if (at.pair >= C) return false;
      const int c = int(blockIdx.x) + at.pair * p.combine_blocks;
      const int first = c * p.chunk;
      it = {p.domain.node_rank, c, first, min(first + p.chunk, p.num_tokens)};
      return true;
    }
    const int kp = pair_key(p, at.pair), ks = sum_key(p, at.sum);
    if (kp == INT_MAX && ks == INT_MAX) return false;
    it = kp < ks ? pair_item(p, at.pair)
                 : item(p, p.domain.node_rank, int(blockIdx.x) + at.sum * p.combine_blocks);
    return true;
  }

  // The step at `at`, and `at` moved past it.
  __device__ WalkStep step(const CombineParams& p, WalkCursor& at) const {
    WalkStep s{WalkStep::kDone, {}, -1};
    if (!p.partial) {
      if (next_first(p, at, s.item)) {
        s.kind = WalkStep::kFirst;
        ++at.pair;
      }
      return s;
    }
    const int kp = pair_key(p, at.pair), ks = sum_key(p, at.sum);
    const int kf = at.final < at.sum ? placed(p, at.final) * 3 + 2 : INT_MAX;
    if (kf < kp && kf < ks) return {WalkStep::kFinal, {}, at.final++};
    if (kp == INT_MAX && ks == INT_MAX) return s;
    s.kind = WalkStep::kFirst;
    if (kp < ks) {
      s.item = pair_item(p, at.pair++);
    } else {
      s.item = item(p, p.domain.node_rank, int(blockIdx.x) + at.sum * p.combine_blocks);
      s.own = at.sum++;
    }
    return s;
  }

  // The first-pass items whose partials go over the network are the block's pairs; pair i is
  // first-pass item sent_item(p, i) in walk order (after the own sums of earlier rounds).
  __device__ int sent_item(const CombineParams& p, int i) const {
    const int cc = (int(blockIdx.x) + i * p.combine_blocks) / others;
    return i + own_placed_before(p, cc);
  }
  // reduced counts a warp's first-pass items in walk order: the count once own chunk j's
  // partials are written (its sum follows the pairs of the round it is placed at).
  __device__ uint32_t reduced_through_own(const CombineParams& p, int j) const {
    return uint32_t(ceil_div_pos((placed(p, j) + 1) * others - int(blockIdx.x), p.combine_blocks) +
                    j + 1);
  }

 private:
  // Own chunks placed at rounds before cc < C: f + lag < cc.
  __device__ int own_placed_before(const CombineParams& p, int cc) const {
    return ceil_div_pos(cc - lag - int(blockIdx.x), p.combine_blocks);
  }
};

}  // namespace combine
}  // namespace hybrid_ep
