// The reduce step of the combine kernel: the fp32 sum of a piece's copies (staged in shared
// memory, ascending local rank, as the reference adds them), rounded to BF16 and stored by the
// lanes from registers straight to the output. Written back over a stage for a TMA bulk store
// instead, each sum crossed shared memory twice more (the lanes' write, the store's read: 84
// instead of 56 KB per token of two BF16 copies) and the warp held the stage until the store
// had read it; dropping that gained only ~1% at 2 ranks x 8 SMs (246.9 -> 243.3 us), so
// shared memory was not what bounded the kernel there. Lanes own 8-column vectors.
// The copy count is a template parameter up to kMaxUnrolled: a runtime count left the inner
// loop at about 80 instructions per vector (branches per copy and per input type), and the
// reduce warps were issue-bound (ncu, 2 ranks x 8 SMs: 15 M instructions for 4,096 tokens).
#pragma once

#include <cstdint>

#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/memory/eager_tiles.h"

namespace hybrid_ep {

// A row in the eager form's tiles (memory/eager_tiles.h): its bytes are the payload bytes from
// `at` on of the slot at `base`, where a tile's signal interrupts them every 4080 bytes.
struct TiledRow {
  uint8_t* base;
  int64_t at;
  __device__ uint8_t* byte(int64_t b) const { return base + EagerTiles::wire_offset(at + b); }
};

// The 16 bytes at byte b of a row: of a contiguous fp32 row, or of a tiled one.
__device__ __forceinline__ float4* vector_at(float* row, int64_t b) {
  return reinterpret_cast<float4*>(reinterpret_cast<uint8_t*>(row) + b);
}
__device__ __forceinline__ float4* vector_at(const TiledRow& row, int64_t b) {
  return reinterpret_cast<float4*>(row.byte(b));
}

constexpr int kMaxUnrolled = 8;

__device__ __forceinline__ void accumulate_fp32(float (&acc)[8], const float4* src) {
  const float4 a = src[0], b = src[1];
  acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
  acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
}

// Stage addresses of a piece's copies: `first` is the first copy's stage, the others follow
// it around the ring.
struct CopyStages {
  uint8_t* base;
  int stride;
  int stages;
  int first;
  __device__ uint8_t* at(int k) const {
    const int s = first + k;
    return base + size_t(s < stages ? s : s - stages) * stride;
  }
};

// BF16 input.
template <int K>
__device__ __forceinline__ void sum_bf16(const CopyStages& st, int vectors, uint4* out, int lane) {
  const uint4* src[K];
#pragma unroll
  for (int k = 0; k < K; ++k) src[k] = reinterpret_cast<const uint4*>(st.at(k));
  // More vectors in flight for few copies: the sum holds the stages of the ring. (7 rounds for
  // two copies measured slower at 2 ranks x 8 SMs: 251.8 against 238.2 us with 4.)
  constexpr int kUnroll = K <= 4 ? 4 : 2;
#pragma unroll kUnroll
  for (int v = lane; v < vectors; v += 32) {
    if constexpr (K == 2) {
      // One rounded BF16 add, the same result as the fp32 sum (add_rounded): the conversions
      // and packs of the fp32 path were half of the kernel's instructions at 2 ranks (ncu).
      out[v] = add_rounded(src[0][v], src[1][v]);
    } else {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < K; ++k) accumulate(acc, src[k][v]);
      out[v] = to_bf16(acc);
    }
  }
}

// fp32 input (the unpermute path's rows).
template <int K>
__device__ __forceinline__ void sum_fp32(const CopyStages& st, int vectors, uint4* out, int lane) {
  const float4* src[K];
#pragma unroll
  for (int k = 0; k < K; ++k) src[k] = reinterpret_cast<const float4*>(st.at(k));
  for (int v = lane; v < vectors; v += 32) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < K; ++k) accumulate_fp32(acc, src[k] + 2 * v);
    out[v] = to_bf16(acc);
  }
}

// More copies than kMaxUnrolled (more than 8 ranks per domain): the same sums, copy count at
// run time.
__device__ __noinline__ void sum_any(CopyStages st, int copies, int vectors, bool fp32_input,
                                     uint4* out, int lane) {
  for (int v = lane; v < vectors; v += 32) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < copies; ++k) {
      if (fp32_input) {
        accumulate_fp32(acc, reinterpret_cast<const float4*>(st.at(k)) + 2 * v);
      } else {
        accumulate(acc, reinterpret_cast<const uint4*>(st.at(k))[v]);
      }
    }
    out[v] = to_bf16(acc);
  }
}

template <int K>
__device__ __forceinline__ void sum_fixed(const CopyStages& st, int vectors, bool fp32_input,
                                          uint4* out, int lane) {
  if (fp32_input) {
    sum_fp32<K>(st, vectors, out, lane);
  } else {
    sum_bf16<K>(st, vectors, out, lane);
  }
}

// The BF16 sum of `copies` (>= 1) staged copies, stored by the lanes to `out` (global memory).
__device__ __forceinline__ void sum_to_output(const CopyStages& st, int copies, int vectors,
                                              bool fp32_input, uint4* out, int lane) {
  switch (copies) {
    case 1:
      sum_fixed<1>(st, vectors, fp32_input, out, lane);
      break;
    case 2:
      sum_fixed<2>(st, vectors, fp32_input, out, lane);
      break;
    case 3:
      sum_fixed<3>(st, vectors, fp32_input, out, lane);
      break;
    case 4:
      sum_fixed<4>(st, vectors, fp32_input, out, lane);
      break;
    case 5:
      sum_fixed<5>(st, vectors, fp32_input, out, lane);
      break;
    case 6:
      sum_fixed<6>(st, vectors, fp32_input, out, lane);
      break;
    case 7:
      sum_fixed<7>(st, vectors, fp32_input, out, lane);
      break;
    case 8:
      sum_fixed<8>(st, vectors, fp32_input, out, lane);
      break;
    default:
      sum_any(st, copies, vectors, fp32_input, out, lane);
      break;
  }
  static_assert(kMaxUnrolled == 8, "the switch above unrolls up to 8 copies");
}

// A partial's BF16 sum (several domains) to `out` in the eager form's tiles: one sum_to_output
// per piece of the row that lies in one tile.
__device__ __forceinline__ void sum_to_tiles(const CopyStages& st, int copies, int vectors,
                                             bool fp32_input, const TiledRow& out, int lane) {
  // In 16-byte vectors: a row is far below 2^31 of them.
  const int end = vectors;
#pragma unroll 1
  for (int v = 0; v < end;) {
    const int n = int(EagerTiles::piece(out.at + v * 16, out.at + end * 16) / 16);
    CopyStages from = st;  // the copies' columns of this piece: 8 per output vector
    from.base += v * (fp32_input ? 32 : 16);
    sum_to_output(from, copies, n, fp32_input, reinterpret_cast<uint4*>(out.byte(v * 16)), lane);
    v += n;
  }
}

// Partial sums (several domains): the fp32 sum of `copies` (>= 0) staged copies, unrounded,
// straight to global memory (the BF16 rounding comes after the other domains' partials), at a
// float row or a TiledRow; each 16-byte half on its own (tiled, the two may lie in different
// tiles).
template <class Row>
__device__ __noinline__ void sum_to_fp32(CopyStages st, int copies, int vectors, bool fp32_input,
                                         Row out, int lane) {
  for (int v = lane; v < vectors; v += 32) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < copies; ++k) {
      if (fp32_input) {
        accumulate_fp32(acc, reinterpret_cast<const float4*>(st.at(k)) + 2 * v);
      } else {
        accumulate(acc, reinterpret_cast<const uint4*>(st.at(k))[v]);
      }
    }
    *vector_at(out, int64_t(v) * 32) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *vector_at(out, int64_t(v) * 32 + 16) = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

}  // namespace hybrid_ep
