// Does the dispatch's HBM mix (1 row read : k written) get faster when every SM reads in the
// same short time windows instead of steadily? hbm_write_mix.cu showed reads and writes each
// above the 1:1 copy roofline on their own, steady mixes at 0.86-0.88, and reads that run ahead
// in one burst at 0.96-0.99. This probe keeps the dispatch's dependency (a row is stored only
// after it was loaded) and gates the loads by the GPU's global timer, common to all SMs and
// processes, so that all SMs refill their rings together.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -o /tmp/hrw benchmarks/cuda/hbm_read_windows.cu
//   /tmp/hrw [ROWS 32768] [K 5] [BLOCKS 128] [SLOTS 14] [ITERS 20] [SCHEDULE [LOW 0]]
//
// SCHEDULE runs one schedule only: steady, batch, loads:P:W or both:P:W (us); with LOW, a
// block whose ring holds fewer than LOW loaded rows loads at once until the next window. Run
// in several processes at once (MPS) with BLOCKS each for the 8-rank regime through
// benchmarks/cuda/processes.sh, which sets PROBE_START_AT so that their timed launches overlap.
//
// One thread per block (one block per SM) drives a ring of SLOTS rows of 14336 B: TMA loads in,
// one TMA bulk store per copy out. Schedules: steady (load as soon as a slot is free), batch
// (refill only an empty ring; each SM on its own clock), and windows of W us every P us in which
// loads may be issued (optionally no stores issued inside them). Every copy is checked.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "best_time.cuh"
#include "hybrid_ep/kernels/common/ptx.cuh"
#include "hybrid_ep/runtime/cuda_check.h"

namespace ptx = hybrid_ep::ptx;

namespace {

constexpr int kRowBytes = 14336;
constexpr int kVectors = kRowBytes / 16;
constexpr int kMaxCopies = 8;
constexpr int kMaxSlots = 15;
constexpr int kStoresReading = 2;  // row groups whose stores may still read their slot

enum Schedule { kSteady, kBatch, kWindowLoads, kWindowBoth };

struct Destinations {
  uint8_t* row[kMaxCopies];
};

struct Gate {
  Schedule schedule;
  uint64_t period_ns, window_ns;
  int low;  // windows: with fewer than `low` loaded rows unstored, load until the next window
  __device__ bool loads_open(uint64_t now) const {
    return schedule < kWindowLoads || now % period_ns < window_ns;
  }
  __device__ bool stores_open(uint64_t now) const {
    return schedule != kWindowBoth || now % period_ns >= window_ns;
  }
};

__device__ __forceinline__ uint4 pattern(int r, int v) { return make_uint4(r, v, r ^ v, 7); }

__global__ void fill(uint4* src, int rows) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(rows) * kVectors;
       i += size_t(gridDim.x) * blockDim.x) {
    src[i] = pattern(int(i / kVectors), int(i % kVectors));
  }
}

__global__ void check(Destinations dst, int k, int rows, unsigned long long* bad) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(rows) * kVectors;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 want = pattern(int(i / kVectors), int(i % kVectors));
#pragma unroll
    for (int j = 0; j < kMaxCopies; ++j) {
      if (j >= k) break;
      const uint4 got = reinterpret_cast<const uint4*>(dst.row[j])[i];
      if (got.x != want.x || got.y != want.y || got.z != want.z || got.w != want.w) {
        atomicAdd(bad, 1ull);
      }
    }
  }
}

__global__ void ring_kernel(const uint8_t* src, Destinations dst, int rows, int k, int slots,
                            Gate gate) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kMaxSlots];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) ptx::mbar_init(&full[s], 1);
  ptx::fence_barrier_init();
  const int mine = (rows - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const auto row_of = [&](int i) { return int(blockIdx.x) + i * int(gridDim.x); };
  int loaded = 0, stored = 0, freed = 0;
  uint64_t free_until = 0;
  while (stored < mine) {
    const uint64_t now = ptx::global_timer_ns();
    const bool refill = gate.schedule != kBatch || freed == loaded;
    if (gate.schedule >= kWindowLoads && loaded - stored < gate.low && now >= free_until) {
      free_until = now - now % gate.period_ns + gate.period_ns;
    }
    if (refill && (gate.loads_open(now) || now < free_until)) {
      for (; loaded < mine && loaded < freed + slots; ++loaded) {
        const int s = loaded % slots;
        ptx::mbar_arrive_expect_tx(&full[s], kRowBytes);
        ptx::bulk_load(ring + size_t(s) * kRowBytes, src + size_t(row_of(loaded)) * kRowBytes,
                       kRowBytes, &full[s]);
      }
    }
    if (stored < loaded && gate.stores_open(now)) {
      const int s = stored % slots;
      ptx::mbar_wait(&full[s], (stored / slots) & 1);
#pragma unroll
      for (int j = 0; j < kMaxCopies; ++j) {
        if (j < k) {
          ptx::bulk_store(dst.row[j] + size_t(row_of(stored)) * kRowBytes,
                          ring + size_t(s) * kRowBytes, kRowBytes);
        }
      }
      ptx::bulk_commit();
      ++stored;
      ptx::bulk_wait_read<kStoresReading>();
      freed = stored > kStoresReading ? stored - kStoresReading : 0;
    } else if (stored == loaded || !gate.stores_open(now)) {
      ptx::bulk_wait_read<0>();  // nothing to issue now: let the slots drain
      freed = stored;
    }
  }
  ptx::bulk_wait<0>();
}

struct Run {
  const char* name;
  Schedule schedule;
  int period_us, window_us;
};

// steady, batch, loads:P:W or both:P:W
Run parse_run(const char* spec) {
  Run r{"steady", kSteady, 1, 0};
  char kind[16] = "";
  std::sscanf(spec, "%15[a-z]:%d:%d", kind, &r.period_us, &r.window_us);
  const std::string name(kind);
  if (name == "batch") return {"batch", kBatch, 1, 0};
  if (name == "loads") return {"loads", kWindowLoads, r.period_us, r.window_us};
  if (name == "both") return {"both", kWindowBoth, r.period_us, r.window_us};
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 32768;
  const int k = argc > 2 ? std::atoi(argv[2]) : 5;
  const int blocks = argc > 3 ? std::atoi(argv[3]) : 128;
  const int slots = argc > 4 ? std::atoi(argv[4]) : 14;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 20;
  const char* only = argc > 6 ? argv[6] : nullptr;
  const int low = argc > 7 ? std::atoi(argv[7]) : 0;
  if (k < 1 || k > kMaxCopies || slots <= kStoresReading || slots > kMaxSlots) {
    std::fprintf(stderr, "K must be 1..%d and SLOTS %d..%d\n", kMaxCopies, kStoresReading + 1,
                 kMaxSlots);
    return 2;
  }
  const size_t bytes = size_t(rows) * kRowBytes;
  uint8_t* src;
  unsigned long long* bad;
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&src, bytes));
  HYBRID_EP_CUDA_CHECK(cudaMalloc(&bad, sizeof(*bad)));
  fill<<<512, 256>>>(reinterpret_cast<uint4*>(src), rows);
  Destinations dst{};
  for (int j = 0; j < k; ++j) HYBRID_EP_CUDA_CHECK(cudaMalloc(&dst.row[j], bytes));
  const int smem = slots * kRowBytes;
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const auto seconds = [&](auto launch) { return best_seconds(launch, iters); };
  const double roofline =
      2.0 * bytes / seconds([&] {
        HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(dst.row[0], src, bytes, cudaMemcpyDeviceToDevice));
      });
  std::printf("rows %d, k %d, %d blocks, %d slots of %d B\n", rows, k, blocks, slots, kRowBytes);
  std::printf("%-34s %9.1f GB/s (roofline)\n", "cudaMemcpyAsync 1:1", roofline / 1e9);
  if (const char* at = std::getenv("PROBE_START_AT")) {  // processes.sh: all copies at once
    HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
    std::this_thread::sleep_until(std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(std::atof(at)))));
  }
  std::vector<Run> runs = {
      {"steady", kSteady, 1, 0},      {"batch", kBatch, 1, 0},
      {"loads", kWindowLoads, 24, 4}, {"loads", kWindowLoads, 36, 6},
      {"loads", kWindowLoads, 48, 8}, {"loads", kWindowLoads, 36, 4},
      {"loads", kWindowLoads, 36, 9}, {"loads", kWindowLoads, 72, 12},
      {"both", kWindowBoth, 36, 4},   {"both", kWindowBoth, 36, 6},
      {"both", kWindowBoth, 48, 6},
  };
  if (only != nullptr) runs = {parse_run(only)};
  for (const Run& r : runs) {
    const Gate gate{r.schedule, uint64_t(r.period_us) * 1000, uint64_t(r.window_us) * 1000, low};
    for (int j = 0; j < k; ++j) HYBRID_EP_CUDA_CHECK(cudaMemset(dst.row[j], 0, bytes));
    const double s =
        seconds([&] { ring_kernel<<<blocks, 32, smem>>>(src, dst, rows, k, slots, gate); });
    HYBRID_EP_CUDA_CHECK(cudaMemset(bad, 0, sizeof(*bad)));
    check<<<512, 256>>>(dst, k, rows, bad);
    unsigned long long wrong = 0;
    HYBRID_EP_CUDA_CHECK(cudaMemcpy(&wrong, bad, sizeof(wrong), cudaMemcpyDeviceToHost));
    const double moved = double(bytes) * (1 + k);
    std::printf("%-6s P %3d us W %2d us low %d: %9.1f GB/s %6.3f of the roofline%s\n", r.name,
                r.period_us, r.window_us, low, moved / s / 1e9, moved / s / roofline,
                wrong ? "  COPIES WRONG" : "");
  }
  return 0;
}
