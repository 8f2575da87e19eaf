// One dispatch row's unpermute, by one warp: the fp32 sum (ascending expert, as the reference
// adds them) of its expert outputs, and its probs row. Used by the standalone unpermute kernel
// and by the fused combine's unpermute blocks.
#pragma once

#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/params.h"

namespace hybrid_ep {

constexpr int kUnpermuteVectorsInFlight = 2;  // 16-byte vectors per lane and expert row
constexpr int kUnpermuteRowsInFlight = 8;     // expert rows whose loads are issued together

// The row's expert targets live in lanes (lane e holds target e, E <= 32 at a time) and are
// broadcast by shuffles. The loads of up to kUnpermuteRowsInFlight expert rows are all issued
// before any is added (in ascending expert, as the reference adds them): with one row's loads
// in flight at a time a warp was latency-bound, which shows when few warps run it (the fused
// combine's unpermute blocks: one block of nine warps per SM).
__device__ __forceinline__ void unpermute_row(const UnpermuteParams& p, int i, int lane) {
  constexpr int kInFlight = kUnpermuteVectorsInFlight;
  constexpr int kRows = kUnpermuteRowsInFlight;
  const int E = p.experts_per_rank;
  const int vectors = p.hidden_size / 8;
  const int32_t* targets = p.dense_to_expert_map + int64_t(i) * E;
  float4* dst = reinterpret_cast<float4*>(p.dense + int64_t(i) * p.hidden_size);
  for (int base = 0; base < vectors; base += 32 * kInFlight) {
    float acc[kInFlight][8] = {};
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int32_t mine = e0 + lane < E ? targets[e0 + lane] : -1;
      const int span = min(32, E - e0);
      for (int g = 0; g < span; g += kRows) {
        int32_t r[kRows];
        uint4 v[kRows][kInFlight];
#pragma unroll
        for (int e = 0; e < kRows; ++e) {
          r[e] = __shfl_sync(0xffffffffu, mine, (g + e) & 31);
          if (g + e >= span) r[e] = -1;
          if (r[e] < 0) continue;
          const uint4* src =
              reinterpret_cast<const uint4*>(p.hidden + int64_t(r[e]) * p.hidden_size);
#pragma unroll
          for (int k = 0; k < kInFlight; ++k) {
            const int at = base + k * 32 + lane;
            if (at < vectors) v[e][k] = src[at];
          }
        }
#pragma unroll
        for (int e = 0; e < kRows; ++e) {
          if (r[e] < 0) continue;
#pragma unroll
          for (int k = 0; k < kInFlight; ++k) {
            if (base + k * 32 + lane < vectors) accumulate(acc[k], v[e][k]);
          }
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
