// Where a put's source lies in this rank's registered buffer, for backends whose puts read
// only that buffer (the NIC's memory key, UCX's memory views name nothing else).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybrid_ep {

// True with `offset` set when [src, src + bytes) lies inside [base, base + size); otherwise
// lane 0 raises `fault_bit` in the fault word (the host reports it) and the put must not go.
__device__ __forceinline__ bool registered_source_offset(const uint8_t* base, uint64_t size,
                                                         const void* src, size_t bytes,
                                                         unsigned int* fault,
                                                         unsigned int fault_bit, int lane,
                                                         uint64_t* offset) {
  const uint64_t at = uint64_t(static_cast<const uint8_t*>(src) - base);
  if (at >= size || bytes > size - at) {
    if (lane == 0) atomicOr(fault, fault_bit);
    return false;
  }
  *offset = at;
  return true;
}

}  // namespace hybrid_ep
