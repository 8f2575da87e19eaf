// The gathered routing's format (docs/engine.md, "Routing all-gather"): per token and
// destination domain, one bit per expert of that domain, expert e of its local rank j at bit
// j * E + e, packed into 32-bit words (bit b in word b / 32 at b % 32; the last word's spare
// bits are zero). Any number of experts per token fits. Host code (the binding's check of this
// format) compiles these too.
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for the host compiler

#include <cstdint>

namespace hybrid_ep {

constexpr int kRoutingWordBits = 32;

__host__ __device__ inline int lowest_set_bit(uint32_t word) {
#ifdef __CUDA_ARCH__
  return __ffs(int(word)) - 1;
#else
  return __builtin_ctz(word);
#endif
}

// Bit k of the result: byte k of `bytes` is not zero (a bool may hold any nonzero value).
__host__ __device__ inline uint32_t nonzero_byte_bits(uint32_t bytes) {
  bytes |= bytes >> 4;
  bytes |= bytes >> 2;
  bytes |= bytes >> 1;
  bytes &= 0x01010101u;
  // Moves byte k's low bit to bit 24 + k; the partial products land on distinct bits (no carry).
  return (bytes * 0x01020408u) >> 24;
}

// One word of a token's bits from `count` (<= 32) consecutive bool columns of its routing map.
// `vector`: `cols` is 16-byte aligned and `count` a multiple of 16.
__host__ __device__ inline uint32_t pack_routing_word(const uint8_t* cols, int count, bool vector) {
  uint32_t word = 0;
  if (vector) {
    for (int q = 0; q < count / 16; ++q) {
      const uint4 v = reinterpret_cast<const uint4*>(cols)[q];
      const uint32_t bits = nonzero_byte_bits(v.x) | nonzero_byte_bits(v.y) << 4 |
                            nonzero_byte_bits(v.z) << 8 | nonzero_byte_bits(v.w) << 12;
      word |= bits << (16 * q);
    }
  } else {
    for (int b = 0; b < count; ++b) word |= uint32_t(cols[b] != 0) << b;
  }
  return word;
}

// Whether pack_routing_word may read 16 bytes at a time for every word of a map whose domains
// have `cols` columns each (rows of N * cols bytes).
__host__ __device__ inline bool routing_vector_reads(const uint8_t* map, int cols) {
  return reinterpret_cast<uintptr_t>(map) % 16 == 0 && cols % 16 == 0;
}

// Word w of a token's bits for domain n, from its bool row of the map (domains of `cols`
// columns each).
__host__ __device__ inline uint32_t routing_word_of_row(const uint8_t* row, int cols, int n, int w,
                                                        bool vector) {
  const int first = kRoutingWordBits * w;
  const int count = cols - first < kRoutingWordBits ? cols - first : kRoutingWordBits;
  return pack_routing_word(row + int64_t(n) * cols + first, count, vector);
}

// Bit j of the result: some expert of local rank j (E experts each) is set in a token's
// `count` words. Skips the rest of a rank's bits once one is found.
__host__ __device__ inline uint64_t ranks_of_routing_words(const uint32_t* words, int count,
                                                           int experts) {
  uint64_t ranks = 0;
  for (int w = 0; w < count; ++w) {
    uint32_t word = words[w];
    while (word != 0) {
      const int j = (kRoutingWordBits * w + lowest_set_bit(word)) / experts;
      ranks |= 1ull << j;
      const int next = (j + 1) * experts - kRoutingWordBits * w;  // rank j + 1's first bit
      word = next >= kRoutingWordBits ? 0 : word & (~0u << next);
    }
  }
  return ranks;
}

__host__ __device__ inline bool routing_bit(const uint32_t* words, int bit) {
  return (words[bit / kRoutingWordBits] >> (bit % kRoutingWordBits)) & 1;
}

}  // namespace hybrid_ep
