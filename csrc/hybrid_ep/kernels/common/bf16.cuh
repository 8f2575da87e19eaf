// Eight BF16 values packed in 16 bytes, added into fp32 and rounded back: the vector unit of
// the reducing kernels (combine, unpermute).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace hybrid_ep {

// BF16 -> fp32 is a 16-bit shift: no conversion instructions needed.
__device__ __forceinline__ void accumulate(float (&acc)[8], const uint4& packed) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    acc[2 * k] += __uint_as_float(words[k] << 16);
    acc[2 * k + 1] += __uint_as_float(words[k] & 0xffff0000u);
  }
}

// Round to nearest even, as torch's fp32 -> BF16 conversion does.
__device__ __forceinline__ uint4 to_bf16(const float (&acc)[8]) {
  uint4 packed;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
  return packed;
}

// The sum of two vectors, rounded once to BF16 (add.rn.bf16x2). The exact sum of two BF16
// values fits fp32 unless their exponents differ by 16 or more, and then both roundings return
// the larger value (the smaller is far below half a BF16 ulp of it), so this equals the fp32
// sum rounded to BF16 (the reference's order, 0 + a + b, differs only in the sign of a zero).
__device__ __forceinline__ uint4 add_rounded(const uint4& a, const uint4& b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w};
  const uint32_t y[4] = {b.x, b.y, b.z, b.w};
  uint32_t sum[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __nv_bfloat162 s = __hadd2(*reinterpret_cast<const __nv_bfloat162*>(&x[k]),
                                     *reinterpret_cast<const __nv_bfloat162*>(&y[k]));
    sum[k] = *reinterpret_cast<const uint32_t*>(&s);
  }
  return make_uint4(sum[0], sum[1], sum[2], sum[3]);
}

}  // namespace hybrid_ep
