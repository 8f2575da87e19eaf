// Two-copy combine designs on B blocks (a loader warp and W reduce warps each, a 16-stage ring
// of whole 14336-byte rows), next to the k:1 copy they must match: how fast can a combine of
// two BF16 copies per token be at 8 SMs, with nothing but the ring?
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -o /tmp/cfi benchmarks/cuda/combine_fan_in.cu
//   /tmp/cfi [TOKENS 4096] [BLOCKS 8] [ITERS 20] [ONLY_DESIGN]
//
// Designs: lanes add the two stages (add_rounded, the combine kernel's two-copy sum) and store
// from registers; a TMA store of the first copy only (no sum: the copy ceiling's traffic);
// a TMA store of the first copy, a wait for it, then a TMA bulk reduce-add of the second in L2;
// the same with the reduce of a warp's previous token issued behind its next token's store.
// Outputs of the sums are compared with the lanes' (zero's sign aside).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "best_time.cuh"
#include "hybrid_ep/kernels/common/bf16.cuh"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/runtime/cuda_check.h"

namespace ptx = hybrid_ep::ptx;

namespace {

constexpr int kRowBytes = 14336;
constexpr int kVectors = kRowBytes / 16;
constexpr int kStages = 16;
constexpr int kMaxWarps = 8;

enum Design { kLaneSum, kStoreFirst, kReduceInL2, kReduceInL2Pipelined };
constexpr int kDesigns = 4;
const char* const kNames[kDesigns] = {"lanes add + store", "TMA store of copy 0 only",
                                      "TMA store, wait, TMA reduce", "TMA reduce pipelined"};

__device__ __forceinline__ void bulk_reduce_add_bf16(void* gmem_dst, const void* smem_src,
                                                     uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [%0], [%1], %2;" ::"l"(
          gmem_dst),
      "r"(ptx::smem_addr(smem_src)), "r"(bytes)
      : "memory");
}

struct Ring {
  uint8_t* rows;
  uint64_t* full;
  uint64_t* empty;
  volatile uint32_t* issued;  // items the loader has issued (a warp may be a round ahead)
  __device__ uint8_t* row(uint32_t item) const { return rows + size_t(item % kStages) * kRowBytes; }
  __device__ uint64_t* full_of(uint32_t item) const { return &full[item % kStages]; }
  __device__ uint64_t* empty_of(uint32_t item) const { return &empty[item % kStages]; }
  __device__ static uint32_t parity(uint32_t item) { return (item / kStages) & 1; }
};

// Loader lane: token i of the block's is items 2i (copy 0) and 2i + 1 (copy 1).
__device__ void load_tokens(const Ring& ring, const uint8_t* copy0, const uint8_t* copy1,
                            int mine) {
  uint32_t item = 0;
  for (int i = 0; i < mine; ++i) {
    const size_t at = size_t(blockIdx.x + i * gridDim.x) * kRowBytes;
    for (int c = 0; c < 2; ++c, ++item) {
      ptx::mbar_wait(ring.empty_of(item), Ring::parity(item) ^ 1);
      ptx::mbar_arrive_expect_tx(ring.full_of(item), kRowBytes);
      ptx::bulk_load(ring.row(item), (c ? copy1 : copy0) + at, kRowBytes, ring.full_of(item));
      *ring.issued = item + 1;
    }
  }
}

// Lane 0 of a pipelined warp: token `pending`'s copy 0 was stored in an earlier group; once all
// groups but the latest are complete, frees that stage and the one of the reduce before it,
// and issues the pending token's reduce.
__device__ void reduce_pending(const Ring& ring, uint8_t* out, int pending, int previous) {
  const uint32_t a = 2 * pending;
  ptx::mbar_arrive(ring.empty_of(a));
  if (previous >= 0) ptx::mbar_arrive(ring.empty_of(2 * previous + 1));
  bulk_reduce_add_bf16(out + size_t(blockIdx.x + pending * gridDim.x) * kRowBytes, ring.row(a + 1),
                       kRowBytes);
  ptx::bulk_commit();
}

__global__ void __launch_bounds__(32 * (1 + kMaxWarps), 1)
    combine_kernel(const uint8_t* copy0, const uint8_t* copy1, uint8_t* out, int tokens, int design,
                   int warps) {
  extern __shared__ __align__(128) uint8_t rows[];
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ uint32_t issued;
  const Ring ring{rows, full, empty, &issued};
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], 1);
    }
    issued = 0;
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int mine = (tokens - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  if (w == 0) {
    if (lane == 0) load_tokens(ring, copy0, copy1, mine);
    return;
  }
  if (w > warps) return;
  int pending = -1, previous = -1;  // pipelined: the token whose reduce waits, the last reduced
  for (int i = w - 1; i < mine; i += warps) {
    const uint32_t a = 2 * i, b = a + 1;
    while (*ring.issued < b + 1) __nanosleep(32);
    ptx::mbar_wait(ring.full_of(a), Ring::parity(a));
    ptx::mbar_wait(ring.full_of(b), Ring::parity(b));
    uint8_t* dst = out + size_t(blockIdx.x + i * gridDim.x) * kRowBytes;
    if (design == kLaneSum) {
      const uint4* x = reinterpret_cast<const uint4*>(ring.row(a));
      const uint4* y = reinterpret_cast<const uint4*>(ring.row(b));
#pragma unroll 4
      for (int v = lane; v < kVectors; v += 32) {
        reinterpret_cast<uint4*>(dst)[v] = hybrid_ep::add_rounded(x[v], y[v]);
      }
      __syncwarp();
      if (lane == 0) {
        ptx::mbar_arrive(ring.empty_of(a));
        ptx::mbar_arrive(ring.empty_of(b));
      }
      continue;
    }
    if (lane != 0) continue;
    ptx::bulk_store(dst, ring.row(a), kRowBytes);
    ptx::bulk_commit();
    if (design == kStoreFirst) {
      ptx::bulk_wait_read<0>();
      ptx::mbar_arrive(ring.empty_of(a));
      ptx::mbar_arrive(ring.empty_of(b));
    } else if (design == kReduceInL2) {
      ptx::bulk_wait<0>();  // copy 0 is written before the reduce adds to it
      ptx::mbar_arrive(ring.empty_of(a));
      bulk_reduce_add_bf16(dst, ring.row(b), kRowBytes);
      ptx::bulk_commit();
      ptx::bulk_wait_read<0>();
      ptx::mbar_arrive(ring.empty_of(b));
    } else {
      if (pending >= 0) {
        ptx::bulk_wait<1>();  // all but this token's store
        reduce_pending(ring, out, pending, previous);
      }
      previous = pending;
      pending = i;
    }
  }
  if (design == kReduceInL2Pipelined && lane == 0 && pending >= 0) {
    ptx::bulk_wait<0>();
    reduce_pending(ring, out, pending, previous);
    ptx::bulk_wait<0>();
    ptx::mbar_arrive(ring.empty_of(2 * pending + 1));
  }
  if (lane == 0) ptx::bulk_wait<0>();
}

uint16_t random_bf16(uint32_t& state) {  // finite values of mixed sign and magnitude
  state = state * 1664525u + 1013904223u;
  const uint32_t sign = state >> 31, exponent = 120 + (state >> 20) % 16, mantissa = state >> 8;
  return uint16_t(sign << 15 | exponent << 7 | (mantissa & 0x7f));
}

}  // namespace

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int blocks = argc > 2 ? std::atoi(argv[2]) : 8;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 20;
  const int only = argc > 4 ? std::atoi(argv[4]) : -1;
  const size_t bytes = size_t(tokens) * kRowBytes;
  std::vector<uint16_t> host(bytes / 2), lanes(bytes / 2), got(bytes / 2);
  uint32_t seed = 12345;
  uint8_t *copy0, *copy1, *out;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&copy0, bytes));
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&copy1, bytes));
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&out, bytes));
  for (auto& h : host) h = random_bf16(seed);
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(copy0, host.data(), bytes, cudaMemcpyHostToDevice));
  for (auto& h : host) h = random_bf16(seed);
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(copy1, host.data(), bytes, cudaMemcpyHostToDevice));
  const int smem = kStages * kRowBytes;
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::printf("%d tokens, %d blocks, %d stages of %d B\n", tokens, blocks, kStages, kRowBytes);
  for (int d = 0; d < kDesigns; ++d) {
    if (only >= 0 && d != only && d != kLaneSum) continue;  // the lanes' sums are the reference
    for (const int warps : {2, 3, 4, 6, 8}) {
      // Pipelined, a warp frees a token's second stage two of its tokens later: with more
      // than three warps the loader would wait for a stage that only its own next load frees.
      if (d == kReduceInL2Pipelined ? warps > 3 : warps == 3) continue;
      const auto launch = [&] {
        combine_kernel<<<blocks, 32 * (1 + kMaxWarps), smem>>>(copy0, copy1, out, tokens, d, warps);
      };
      HYBRID_EP_CUDA_CHECK(cudaMemset(out, 0, bytes));
      launch();
      HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
      HYBRID_EP_CUDA_CHECK(cudaGetLastError());
      HYBRID_EP_CUDA_CHECK(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
      if (d == kLaneSum && warps == 2) lanes = got;
      size_t differ = 0;
      for (size_t v = 0; v < got.size(); ++v) {
        const bool zeros = (got[v] & 0x7fff) == 0 && (lanes[v] & 0x7fff) == 0;
        differ += got[v] != lanes[v] && !zeros;
      }
      const double us = best_seconds(launch, iters) * 1e6;
      const double traffic = 3.0 * bytes;  // two loads and a store per token
      std::printf("%-28s %d warps %8.1f us %7.1f GB/s per SM  %s\n", kNames[d], warps, us,
                  traffic / (us * 1e-6) / blocks / 1e9,
                  d == kStoreFirst ? "(no sum)"
                  : differ         ? "sums DIFFER from the lanes'"
                                   : "sums equal the lanes'");
    }
  }
  return 0;
}
