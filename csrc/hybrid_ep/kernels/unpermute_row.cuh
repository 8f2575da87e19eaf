// One dispatch row's unpermute, by one warp: the fp32 sum (ascending expert, as the reference
// adds them) of its expert outputs, and its probs row. Used by the standalone unpermute kernel
// and by the fused combine's unpermute blocks.
#pragma once

#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {

constexpr int kUnpermuteVectorsInFlight = 2;  // 16-byte vectors per lane summed side by side

// The row's expert targets live in lanes (lane e holds target e, E <= 32 at a time) and are
// broadcast by shuffles, so the inner loop issues only the loads of the rows it adds; a lane
// sums kUnpermuteVectorsInFlight vectors at once to keep several loads in flight.
__device__ __forceinline__ void unpermute_row(const UnpermuteParams& p, int i, int lane) {
  constexpr int kInFlight = kUnpermuteVectorsInFlight;
  const int E = p.experts_per_rank;
  const int vectors = p.hidden_size / 8;
  const int32_t* targets = p.dense_to_expert_map + int64_t(i) * E;
  float4* dst = reinterpret_cast<float4*>(p.dense + int64_t(i) * p.hidden_size);
  for (int base = 0; base < vectors; base += 32 * kInFlight) {
    float acc[kInFlight][8] = {};
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int32_t mine = e0 + lane < E ? targets[e0 + lane] : -1;
      const int span = min(32, E - e0);
      for (int e = 0; e < span; ++e) {
        const int32_t r = __shfl_sync(0xffffffffu, mine, e);
        if (r < 0) continue;
        const uint4* src = reinterpret_cast<const uint4*>(p.hidden + int64_t(r) * p.hidden_size);
        uint4 v[kInFlight];
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const int at = base + k * 32 + lane;
          if (at < vectors) v[k] = src[at];
        }
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          if (base + k * 32 + lane < vectors) accumulate(acc[k], v[k]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int at = base + k * 32 + lane;
      if (at >= vectors) continue;
      dst[2 * at] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
      dst[2 * at + 1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
    }
  }
  if (p.dense_probs != nullptr) {
    float* probs = p.dense_probs + int64_t(i) * p.prob_cols + p.prob_col_offset;
    for (int e = lane; e < E; e += 32) {
      const int32_t r = targets[e];
      probs[e] = r >= 0 && p.probs != nullptr ? p.probs[r] : 0.f;
    }
  }
}

}  // namespace hybrid_ep
