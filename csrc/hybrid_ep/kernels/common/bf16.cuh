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

}  // namespace hybrid_ep
