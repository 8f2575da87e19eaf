// Ways of writing one source row into k destinations on one GPU, against the 1:1 copy roofline
// (cudaMemcpyAsync device to device) and cudaMemsetAsync: how far below the roofline does the
// dispatch's HBM-regime mix (1 load : 5.4 stores) stay, and does the write path matter?
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -o /tmp/hwm benchmarks/cuda/hbm_write_mix.cu
//   /tmp/hwm [ROWS 32768] [K 5] [BLOCKS 128] [WARPS 4] [ITERS 20] [ONLY_CASE]
//
// Rows are 14336 B (hidden 7168, BF16); one block per SM, WARPS warps (and twice as many) each.
// Cases: lane writes only (no loads); lane copy (16-byte loads, then the k stores); lane copy
// with 7 loads in flight per lane; TMA load + lane stores; TMA load + TMA stores; TMA loads
// alongside stores of constants (the stores need no loaded data; each warp still waits for its
// row's load before the next row); TMA loads only; split: half the warps only TMA-load the
// rows, the others only write the copies (reads and writes as independent streams on the same
// SMs). Bandwidth counts every byte read and written once; the best of 3 x ITERS.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "best_time.cuh"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/runtime/cuda_check.h"

namespace ptx = hybrid_ep::ptx;

namespace {

constexpr int kRowBytes = 14336;
constexpr int kVectors = kRowBytes / 16;
constexpr int kMaxCopies = 8;

enum Case {
  kWriteOnly,
  kLaneCopy,
  kLaneCopyDeep,
  kTmaLanes,
  kTmaTma,
  kTmaConst,
  kTmaLoadsOnly,
  kSplit
};
constexpr int kCases = 8;
const char* const kNames[kCases] = {"lane writes only",       "lane copy",
                                    "lane copy, 7 in flight", "TMA load + lane stores",
                                    "TMA load + TMA stores",  "TMA loads + const stores",
                                    "TMA loads only",         "split: load warps, store warps"};

bool uses_tma(int c) { return c >= kTmaLanes; }

struct Destinations {
  uint8_t* row[kMaxCopies];
};

__device__ __forceinline__ uint4* at(const Destinations& d, int j, int r) {
  return reinterpret_cast<uint4*>(d.row[j] + size_t(r) * kRowBytes);
}

// The lanes write row r's k copies with values that need no load.
__device__ __forceinline__ void write_constants(const Destinations& dst, int k, int r, int lane) {
  for (int v = lane; v < kVectors; v += 32) {
#pragma unroll
    for (int j = 0; j < kMaxCopies; ++j) {
      if (j < k) at(dst, j, r)[v] = make_uint4(r, v, 0, 0);
    }
  }
}

// Lanes only: each warp takes whole rows, grid-strided.
__global__ void lane_kernel(const uint8_t* src, Destinations dst, int rows, int k, int which) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
    const uint4* s = reinterpret_cast<const uint4*>(src + size_t(r) * kRowBytes);
    if (which == kLaneCopyDeep) {  // 896 vectors = 4 rounds of 32 lanes x 7
      constexpr int kDepth = 7;
      for (int v0 = lane; v0 < kVectors; v0 += 32 * kDepth) {
        uint4 x[kDepth];
#pragma unroll
        for (int u = 0; u < kDepth; ++u) x[u] = __ldg(s + v0 + 32 * u);
#pragma unroll
        for (int j = 0; j < kMaxCopies; ++j) {
          if (j >= k) break;
#pragma unroll
          for (int u = 0; u < kDepth; ++u) at(dst, j, r)[v0 + 32 * u] = x[u];
        }
      }
      continue;
    }
    if (which == kWriteOnly) {
      write_constants(dst, k, r, lane);
      continue;
    }
    for (int v = lane; v < kVectors; v += 32) {
      const uint4 x = __ldg(s + v);
#pragma unroll
      for (int j = 0; j < kMaxCopies; ++j) {
        if (j >= k) break;
        at(dst, j, r)[v] = x;
      }
    }
  }
}

// TMA loads: each warp owns two row slots of shared memory and loads its next rows ahead.
__global__ void tma_kernel(const uint8_t* src, Destinations dst, int rows, int k, int which) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full_bars[2 * 32];
  const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* full = full_bars + 2 * w;
  const auto slot = [&](int s) { return smem + size_t(2 * w + s) * kRowBytes; };
  if (lane == 0) {
    ptx::mbar_init(&full[0], 1);
    ptx::mbar_init(&full[1], 1);
    ptx::fence_barrier_init();
  }
  __syncwarp();
  int step = gridDim.x * warps;
  int first = blockIdx.x * warps + w;
  if (which == kSplit) {  // the first half of the warps load, the others write
    const int loaders = warps / 2, writers = warps - loaders;
    if (w >= loaders) {
      for (int r = blockIdx.x * writers + w - loaders; r < rows; r += gridDim.x * writers) {
        write_constants(dst, k, r, lane);
      }
      return;
    }
    step = gridDim.x * loaders;
    first = blockIdx.x * loaders + w;
  }
  const auto load = [&](int r, int s) {
    ptx::mbar_arrive_expect_tx(&full[s], kRowBytes);
    ptx::bulk_load(slot(s), src + size_t(r) * kRowBytes, kRowBytes, &full[s]);
  };
  if (lane == 0) {
    if (first < rows) load(first, 0);
    if (first + step < rows) load(first + step, 1);
  }
  uint32_t phases = 0;
  int i = 0;
  for (int r = first; r < rows; r += step, ++i) {
    const int s = i & 1;
    if (which == kTmaConst) write_constants(dst, k, r, lane);
    ptx::mbar_wait(&full[s], (phases >> s) & 1);
    phases ^= 1u << s;
    if (which == kTmaLanes) {
      const uint4* row = reinterpret_cast<const uint4*>(slot(s));
      for (int v = lane; v < kVectors; v += 32) {
        const uint4 x = row[v];
#pragma unroll
        for (int j = 0; j < kMaxCopies; ++j) {
          if (j < k) at(dst, j, r)[v] = x;
        }
      }
    } else if (which == kTmaTma && lane == 0) {
#pragma unroll
      for (int j = 0; j < kMaxCopies; ++j) {
        if (j < k) ptx::bulk_store(at(dst, j, r), slot(s), kRowBytes);
      }
      ptx::bulk_commit();
      ptx::bulk_wait_read<0>();
    }
    __syncwarp();  // the lanes are done reading the slot
    if (lane == 0) {
      ptx::fence_proxy_async_shared();
      if (r + 2 * step < rows) load(r + 2 * step, s);
    }
  }
  if (lane == 0) ptx::bulk_wait<0>();
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 32768;
  const int k = argc > 2 ? std::atoi(argv[2]) : 5;
  const int blocks = argc > 3 ? std::atoi(argv[3]) : 128;
  const int warps = argc > 4 ? std::atoi(argv[4]) : 4;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 20;
  const int only = argc > 6 ? std::atoi(argv[6]) : -1;
  if (k < 1 || k > kMaxCopies || warps < 1 || 2 * warps > 32) {
    std::fprintf(stderr, "K must be 1..%d and WARPS 1..16\n", kMaxCopies);
    return 2;
  }
  const size_t bytes = size_t(rows) * kRowBytes;
  uint8_t* src;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&src, bytes));
  HYBRID_EP_CUDA_CHECK(cudaMemset(src, 7, bytes));
  Destinations dst{};
  for (int j = 0; j < k; ++j) HYBRID_EP_CUDA_CHECK(cudaMalloc(&dst.row[j], bytes));
  const auto seconds = [&](auto launch) { return best_seconds(launch, iters); };
  std::printf("rows %d, k %d, %d blocks, row %d B\n", rows, k, blocks, kRowBytes);
  std::printf(
      "%-30s %9.1f GB/s\n", "cudaMemsetAsync",
      bytes / seconds([&] { HYBRID_EP_CUDA_CHECK(cudaMemsetAsync(dst.row[0], 0, bytes)); }) / 1e9);
  const double roofline =
      2.0 * bytes / seconds([&] {
        HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(dst.row[0], src, bytes, cudaMemcpyDeviceToDevice));
      });
  std::printf("%-30s %9.1f GB/s (roofline)\n", "cudaMemcpyAsync 1:1", roofline / 1e9);
  for (int c = 0; c < kCases; ++c) {
    if (only >= 0 && c != only) continue;
    for (const int w : {warps, 2 * warps}) {
      const int smem = uses_tma(c) ? 2 * w * kRowBytes : 0;
      if (smem > 227 * 1024 || (c == kSplit && w < 2)) continue;
      if (uses_tma(c)) {
        HYBRID_EP_CUDA_CHECK(
            cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      }
      const double s = seconds([&] {
        if (uses_tma(c)) {
          tma_kernel<<<blocks, 32 * w, smem>>>(src, dst, rows, k, c);
        } else {
          lane_kernel<<<blocks, 32 * w>>>(src, dst, rows, k, c);
        }
      });
      const int reads = c == kWriteOnly ? 0 : 1, writes = c == kTmaLoadsOnly ? 0 : k;
      const double moved = double(bytes) * (reads + writes);
      std::printf("%-30s %2d warps %9.1f GB/s %6.3f of the roofline\n", kNames[c], w,
                  moved / s / 1e9, moved / s / roofline);
    }
  }
  return 0;
}
