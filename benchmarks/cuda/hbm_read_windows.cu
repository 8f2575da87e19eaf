// Does the dispatch's HBM mix (1 row read : k written) get faster when every SM reads in the
// same short time windows instead of steadily? hbm_write_mix.cu showed reads and writes each
// above the 1:1 copy roofline on their own, steady mixes at 0.86-0.88, and reads that run ahead
// in one burst at 0.96-0.99. This probe keeps the dispatch's dependency (a row is stored only
// after it was loaded) and gates the loads by the GPU's global timer, common to all SMs and
// processes, so that all SMs refill their rings together.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -o /tmp/hrw benchmarks/cuda/hbm_read_windows.cu
//   /tmp/hrw [ROWS 32768] [K 5] [BLOCKS 128] [SLOTS 14] [ITERS 20] [SCHEDULE [LOW 0
//            [ROUTED 0 [WARPS 0]]]]
//
// SCHEDULE runs one schedule only: steady, batch, loads:P:W or both:P:W (us); with LOW, a
// block whose ring holds fewer than LOW loaded rows loads at once until the next window. Run
// in several processes at once (MPS) with BLOCKS each for the 8-rank regime through
// benchmarks/cuda/processes.sh, which sets PROBE_START_AT: each copy then first runs ITERS
// launches from that instant and reports their bytes and end (the summed rate of launches that
// overlapped), then the best-of timing.
// ROUTED 1: row r gets as many copies as top-8 of 64 uniform experts hit ranks of 8 (1-8,
// 5.4 on average) instead of K. WARPS 1: the dispatch's roles (warps_kernel) instead of one
// thread; WARPS 2: the same with a loader that fills any free slot (any_slot_kernel); no LOW
// then, and no stores held back in the windows.
//
// One thread per block (one block per SM) drives a ring of SLOTS rows of 14336 B: TMA loads in,
// one TMA bulk store per copy out. Schedules: steady (load as soon as a slot is free), batch
// (refill only an empty ring; each SM on its own clock), and windows of W us every P us in which
// loads may be issued (optionally no stores issued inside them). Every copy is checked.
//
// PROBE_IPC_DIR (processes.sh with PROBE_IPC=1; PROBE_RANK, PROBE_RANKS set per copy): the
// copies go where the dispatch writes them, into the other processes' memory through CUDA IPC
// mappings. Each copy allocates a receive buffer of one region per process, publishes its handle
// in that folder and opens the others'; copy j of a row goes to process (rank + j) % ranks, in
// region `rank`. PROBE_CONTIGUOUS=1: each block copies one range of rows. PROBE_GATED_GAP_US (with
// PROBE_IPC_DIR) adds a pass run as the dispatch runs its calls: launch i of every copy waits on
// the GPU until one instant of the global timer (the first published by rank 0, then GAP us apart),
// and each launch is timed alone ("gated").
// PROBE_TRACE=1 (one thread per block, with PROBE_START_AT): the middle launch of the first pass
// prints one "TRACE probe" line per block, where its thread's time went (BlockTrace);
// processes.sh collects them into PROBE_TRACE_OUT, each with its copy's rank.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "best_time.cuh"
#include "hybrid_ep/kernels/common/ptx.cuh"
// The library's start gate, built into this one-file probe (no link step).
#include "hybrid_ep/kernels/start_gate.cu"
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

// Copies of row r: k, or (routed) copies[r].
__device__ __forceinline__ int copies_of(const uint8_t* copies, int k, int r) {
  return copies != nullptr ? copies[r] : k;
}

__global__ void check(Destinations dst, int k, const uint8_t* copies, int rows,
                      unsigned long long* bad) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(rows) * kVectors;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 want = pattern(int(i / kVectors), int(i % kVectors));
    const int kr = copies_of(copies, k, int(i / kVectors));
#pragma unroll
    for (int j = 0; j < kMaxCopies; ++j) {
      if (j >= kr) break;
      const uint4 got = reinterpret_cast<const uint4*>(dst.row[j])[i];
      if (got.x != want.x || got.y != want.y || got.z != want.z || got.w != want.w) {
        atomicAdd(bad, 1ull);
      }
    }
  }
}

// Every kernel's block takes rows blockIdx.x, blockIdx.x + gridDim.x, ... (neighbouring blocks
// on neighbouring rows), or with PROBE_CONTIGUOUS=1 one range of rows, as a dispatch block takes
// its chunks' tokens: how many, and which.
__constant__ int g_contiguous;
__device__ __forceinline__ int rows_per_block(int rows) {
  return (rows + int(gridDim.x) - 1) / int(gridDim.x);
}
__device__ __forceinline__ int block_row_count(int rows) {
  if (g_contiguous) {
    const int first = int(blockIdx.x) * rows_per_block(rows);
    return first < rows ? min(rows - first, rows_per_block(rows)) : 0;
  }
  return (rows - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
}
__device__ __forceinline__ int block_row(int i, int rows) {
  return g_contiguous ? int(blockIdx.x) * rows_per_block(rows) + i
                      : int(blockIdx.x) + i * int(gridDim.x);
}

// One TMA bulk store of the row in `slot` per copy.
__device__ __forceinline__ void store_copies(const Destinations& dst, int copies, int row,
                                             const uint8_t* slot) {
#pragma unroll
  for (int j = 0; j < kMaxCopies; ++j) {
    if (j < copies) ptx::bulk_store(dst.row[j] + size_t(row) * kRowBytes, slot, kRowBytes);
  }
}

// A store warp's turn: the row's copies, then its slot back to the loader once they read it.
__device__ __forceinline__ void store_and_free(const Destinations& dst, int copies, int row,
                                               const uint8_t* ring, int s, uint64_t* empty) {
  store_copies(dst, copies, row, ring + size_t(s) * kRowBytes);
  ptx::bulk_commit();
  ptx::bulk_wait_read<0>();
  ptx::mbar_arrive(empty);
}

__device__ int g_trace;  // this launch reports its BlockTrace

template <class Step>
__device__ __forceinline__ long long cycles_of(Step step) {
  const long long start = clock64();
  step();
  return clock64() - start;
}

// Where a block's one thread spends its time (clock cycles): with nothing loaded to store
// (starved), waiting for a row's load, issuing stores or loads (the TMA unit takes no more), and
// waiting until its stores have read their slots; per read window, whether the ring was empty.
struct BlockTrace {
  uint64_t t0;
  long long c0, last;
  long long starved = 0, wait_full = 0, wait_read = 0, issue_store = 0, issue_load = 0;
  unsigned windows = 0, empty_at_open = 0, unstored_at_open = 0;
  uint64_t window = ~0ull;
  bool idle = false;

  __device__ BlockTrace() {
    t0 = ptx::global_timer_ns();
    c0 = last = clock64();
  }
  __device__ void step() {  // the top of each loop turn
    const long long now = clock64();
    if (idle) starved += now - last;
    last = now;
  }
  __device__ void loading_in(uint64_t w, int unstored) {
    if (w == window) return;
    window = w;
    ++windows;
    unstored_at_open += unstored;
    if (unstored == 0) ++empty_at_open;
  }
  __device__ void report(const Gate& gate, uint64_t loop_end_ns, long long loop_cycles,
                         int rows) const {
    printf(
        "TRACE probe b=%d period=%llu open=%llu t0=%llu loop_ns=%llu end_ns=%llu "
        "loop_cyc=%lld starved=%lld wait_full=%lld wait_read=%lld issue_store=%lld "
        "issue_load=%lld rows=%d windows=%u empty_at_open=%u unstored_at_open=%u\n",
        int(blockIdx.x), (unsigned long long)gate.period_ns, (unsigned long long)gate.window_ns,
        (unsigned long long)t0, (unsigned long long)(loop_end_ns - t0),
        (unsigned long long)(ptx::global_timer_ns() - t0), loop_cycles, starved, wait_full,
        wait_read, issue_store, issue_load, rows, windows, empty_at_open, unstored_at_open);
  }
};

__global__ void ring_kernel(const uint8_t* src, Destinations dst, int rows, int k,
                            const uint8_t* copies, int slots, Gate gate) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kMaxSlots];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) ptx::mbar_init(&full[s], 1);
  ptx::fence_barrier_init();
  const int mine = block_row_count(rows);
  int loaded = 0, stored = 0, freed = 0;
  uint64_t free_until = 0;
  BlockTrace trace;
  while (stored < mine) {
    const uint64_t now = ptx::global_timer_ns();
    trace.step();
    const bool refill = gate.schedule != kBatch || freed == loaded;
    if (gate.schedule >= kWindowLoads && loaded - stored < gate.low && now >= free_until) {
      free_until = now - now % gate.period_ns + gate.period_ns;
    }
    if (refill && (gate.loads_open(now) || now < free_until)) {
      if (loaded < mine && loaded < freed + slots) {
        trace.loading_in(gate.schedule >= kWindowLoads ? now / gate.period_ns : 0, loaded - stored);
      }
      trace.issue_load += cycles_of([&] {
        for (; loaded < mine && loaded < freed + slots; ++loaded) {
          const int s = loaded % slots;
          ptx::mbar_arrive_expect_tx(&full[s], kRowBytes);
          ptx::bulk_load(ring + size_t(s) * kRowBytes,
                         src + size_t(block_row(loaded, rows)) * kRowBytes, kRowBytes, &full[s]);
        }
      });
    }
    trace.idle = !(stored < loaded && gate.stores_open(now));
    if (!trace.idle) {
      const int s = stored % slots;
      trace.wait_full += cycles_of([&] { ptx::mbar_wait(&full[s], (stored / slots) & 1); });
      trace.issue_store += cycles_of([&] {
        const int row = block_row(stored, rows);
        store_copies(dst, copies_of(copies, k, row), row, ring + size_t(s) * kRowBytes);
        ptx::bulk_commit();
      });
      ++stored;
      trace.wait_read += cycles_of([] { ptx::bulk_wait_read<kStoresReading>(); });
      freed = stored > kStoresReading ? stored - kStoresReading : 0;
    } else if (stored == loaded || !gate.stores_open(now)) {
      ptx::bulk_wait_read<0>();  // nothing to issue now: let the slots drain
      freed = stored;
    }
  }
  const uint64_t loop_end_ns = ptx::global_timer_ns();
  const long long loop_cycles = clock64() - trace.c0;
  ptx::bulk_wait<0>();
  if (g_trace) trace.report(gate, loop_end_ns, loop_cycles, stored);
}

// The dispatch's roles: warp 0's lane 0 loads rows into the ring in order (gated as above);
// store warp w (1..kStoreWarps) takes rows w - 1, w - 1 + kStoreWarps, ..., issues a row's
// stores and frees its slot once they have read it.
constexpr int kStoreWarps = 4;

__global__ void warps_kernel(const uint8_t* src, Destinations dst, int rows, int k,
                             const uint8_t* copies, int slots, Gate gate) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kMaxSlots], empty[kMaxSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (lane != 0) return;
  const int mine = block_row_count(rows);
  if (warp == 0) {
    for (int i = 0; i < mine; ++i) {
      const int s = i % slots;
      ptx::mbar_wait(&empty[s], ((i / slots) & 1) ^ 1);
      while (!gate.loads_open(ptx::global_timer_ns())) {
      }
      ptx::mbar_arrive_expect_tx(&full[s], kRowBytes);
      ptx::bulk_load(ring + size_t(s) * kRowBytes, src + size_t(block_row(i, rows)) * kRowBytes,
                     kRowBytes, &full[s]);
    }
    return;
  }
  for (int i = warp - 1; i < mine; i += kStoreWarps) {
    const int s = i % slots;
    ptx::mbar_wait(&full[s], (i / slots) & 1);
    store_and_free(dst, copies_of(copies, k, block_row(i, rows)), block_row(i, rows), ring, s,
                   &empty[s]);
  }
  ptx::bulk_wait<0>();
}

// The same roles, but the loader fills any free slot, not the next one in ring order: item i's
// slot is published with its load (slot_of, behind full[i % kItems]), so a store warp still slow
// on one row no longer holds back the loads of the slots freed after it.
constexpr int kItems = 64;  // items in flight at most: slots + store warps

__global__ void any_slot_kernel(const uint8_t* src, Destinations dst, int rows, int k,
                                const uint8_t* copies, int slots, Gate gate) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kItems], empty[kMaxSlots];
  __shared__ int slot_of[kItems];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kItems; ++i) ptx::mbar_init(&full[i], 1);
    for (int s = 0; s < slots; ++s) ptx::mbar_init(&empty[s], 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (lane != 0) return;
  const int mine = block_row_count(rows);
  if (warp == 0) {
    uint32_t busy = 0, phases = 0;  // per slot: holds a row; parity of its next release
    int next = 0;
    for (int i = 0; i < mine; ++i) {
      int s = -1;
      while (s < 0) {  // the first free slot from `next` on
        for (int n = 0; n < slots && s < 0; ++n) {
          const int c = (next + n) % slots;
          if (busy >> c & 1) {
            if (!ptx::mbar_try_wait(&empty[c], phases >> c & 1)) continue;
            busy &= ~(1u << c);
            phases ^= 1u << c;
          }
          s = c;
        }
      }
      next = (s + 1) % slots;
      busy |= 1u << s;
      while (!gate.loads_open(ptx::global_timer_ns())) {
      }
      slot_of[i % kItems] = s;
      ptx::mbar_arrive_expect_tx(&full[i % kItems], kRowBytes);
      ptx::bulk_load(ring + size_t(s) * kRowBytes, src + size_t(block_row(i, rows)) * kRowBytes,
                     kRowBytes, &full[i % kItems]);
    }
    return;
  }
  for (int i = warp - 1; i < mine; i += kStoreWarps) {
    ptx::mbar_wait(&full[i % kItems], (i / kItems) & 1);
    const int s = slot_of[i % kItems];
    store_and_free(dst, copies_of(copies, k, block_row(i, rows)), block_row(i, rows), ring, s,
                   &empty[s]);
  }
  ptx::bulk_wait<0>();
}

// Distinct ranks among top-8 of 64 experts (8 per rank), uniform: the dispatch's copies per
// token at 8 ranks (5.4 on average).
std::vector<uint8_t> routed_copies(int rows) {
  std::vector<uint8_t> out(rows);
  uint64_t x = 88172645463325252ull;
  for (int r = 0; r < rows; ++r) {
    uint64_t experts = 0;
    while (__builtin_popcountll(experts) < 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      experts |= 1ull << (x % 64);
    }
    int ranks = 0;
    for (int j = 0; j < 8; ++j) ranks += ((experts >> (8 * j)) & 0xff) != 0;
    out[r] = uint8_t(ranks);
  }
  return out;
}

void wait_for_file(const std::string& path) {
  while (!std::ifstream(path).good()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Waits until every process has written `name`.RANK into `dir` (a file-system barrier).
void wait_for_all(const std::string& dir, const char* name, int ranks) {
  for (int r = 0; r < ranks; ++r) wait_for_file(dir + "/" + name + "." + std::to_string(r));
}

void publish(const std::string& dir, const char* name, int rank, const void* data, size_t size) {
  const std::string path = dir + "/" + name + "." + std::to_string(rank);
  std::ofstream(path + ".tmp", std::ios::binary).write(static_cast<const char*>(data), size);
  std::rename((path + ".tmp").c_str(), path.c_str());  // readers never see half a handle
}

// The receive buffers of PROBE_IPC_DIR mode: this process's, and the peers' mapped.
struct IpcBuffers {
  std::string dir;
  int rank = 0, ranks = 1;
  uint8_t* own = nullptr;
  std::vector<uint8_t*> peers;

  // Copy j goes to process (rank + j) % ranks, region `rank` of its buffer.
  void open(size_t region_bytes, int copies, Destinations& dst) {
    const size_t page = size_t(2) << 20;  // whole 2 MiB pages: see docs/engine.md, Memory
    const size_t size = (region_bytes * ranks + page - 1) / page * page;
    HYBRID_EP_CUDA_CHECK(cudaMalloc(&own, size));
    cudaIpcMemHandle_t handle;
    HYBRID_EP_CUDA_CHECK(cudaIpcGetMemHandle(&handle, own));
    publish(dir, "handle", rank, &handle, sizeof(handle));
    wait_for_all(dir, "handle", ranks);
    peers.assign(ranks, nullptr);
    for (int r = 0; r < ranks; ++r) {
      if (r == rank) {
        peers[r] = own;
        continue;
      }
      std::ifstream in(dir + "/handle." + std::to_string(r), std::ios::binary);
      in.read(reinterpret_cast<char*>(&handle), sizeof(handle));
      void* mapped;
      HYBRID_EP_CUDA_CHECK(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
      peers[r] = static_cast<uint8_t*>(mapped);
    }
    for (int j = 0; j < copies; ++j) {
      dst.row[j] = peers[(rank + j) % ranks] + region_bytes * rank;
    }
  }

  // Nobody unmaps or frees while a peer may still write into its buffer.
  void close() {
    HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
    const char done = 1;
    publish(dir, "done", rank, &done, 1);
    wait_for_all(dir, "done", ranks);
    for (int r = 0; r < ranks; ++r) {
      if (r != rank) HYBRID_EP_CUDA_CHECK(cudaIpcCloseMemHandle(peers[r]));
    }
    HYBRID_EP_CUDA_CHECK(cudaFree(own));
  }
};

// Launch i of every copy starts at t0 + i * gap_ns of the GPU's global timer (one clock for all
// processes on the GPU; t0 from rank 0 through the IPC folder). Returns the mean time of one
// launch, from its gate's end to its own.
template <class Launch>
double gated_launch_seconds(Launch launch, const IpcBuffers& ipc, int run, int iters,
                            uint64_t gap_ns) {
  const std::string name = "t0-" + std::to_string(run);
  uint64_t t0 = 0;
  if (ipc.rank == 0) {
    t0 = hybrid_ep::gpu_time_ns(nullptr) + 200'000'000ull;  // time for the others to read it
    publish(ipc.dir, name.c_str(), 0, &t0, sizeof(t0));
  } else {
    const std::string path = ipc.dir + "/" + name + ".0";
    wait_for_file(path);
    std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&t0), sizeof(t0));
  }
  std::vector<cudaEvent_t> begin(iters), end(iters);
  for (int i = 0; i < iters; ++i) {
    HYBRID_EP_CUDA_CHECK(cudaEventCreate(&begin[i]));
    HYBRID_EP_CUDA_CHECK(cudaEventCreate(&end[i]));
  }
  for (int i = 0; i < iters; ++i) {
    hybrid_ep::launch_start_gate(t0 + uint64_t(i) * gap_ns, nullptr);
    HYBRID_EP_CUDA_CHECK(cudaEventRecord(begin[i]));
    launch();
    HYBRID_EP_CUDA_CHECK(cudaEventRecord(end[i]));
  }
  HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
  double total_ms = 0;
  for (int i = 0; i < iters; ++i) {
    float ms;
    HYBRID_EP_CUDA_CHECK(cudaEventElapsedTime(&ms, begin[i], end[i]));
    total_ms += ms;
    HYBRID_EP_CUDA_CHECK(cudaEventDestroy(begin[i]));
    HYBRID_EP_CUDA_CHECK(cudaEventDestroy(end[i]));
  }
  return total_ms / iters * 1e-3;
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
  const bool routed = argc > 8 && std::atoi(argv[8]) != 0;
  const int warps = argc > 9 ? std::atoi(argv[9]) : 0;
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
  const int buffers = routed ? kMaxCopies : k;
  IpcBuffers ipc;
  const char* ipc_dir = std::getenv("PROBE_IPC_DIR");
  if (ipc_dir != nullptr) {
    ipc.dir = ipc_dir;
    ipc.rank = std::atoi(std::getenv("PROBE_RANK"));
    ipc.ranks = std::atoi(std::getenv("PROBE_RANKS"));
    if (ipc.ranks < buffers) {
      std::fprintf(stderr, "PROBE_IPC_DIR needs PROBE_RANKS >= %d copies\n", buffers);
      return 2;
    }
    ipc.open(bytes, buffers, dst);
  } else {
    for (int j = 0; j < buffers; ++j) HYBRID_EP_CUDA_CHECK(cudaMalloc(&dst.row[j], bytes));
  }
  uint8_t* copies = nullptr;
  double writes = k;  // per row, on average
  if (routed) {
    const std::vector<uint8_t> host = routed_copies(rows);
    writes = 0;
    for (const uint8_t c : host) writes += double(c) / rows;
    HYBRID_EP_CUDA_CHECK(cudaMalloc(&copies, rows));
    HYBRID_EP_CUDA_CHECK(cudaMemcpy(copies, host.data(), rows, cudaMemcpyHostToDevice));
  }
  const int smem = slots * kRowBytes;
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(warps_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  HYBRID_EP_CUDA_CHECK(
      cudaFuncSetAttribute(any_slot_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const auto seconds = [&](auto launch) { return best_seconds(launch, iters); };
  const double roofline =
      2.0 * bytes / seconds([&] {
        HYBRID_EP_CUDA_CHECK(cudaMemcpyAsync(dst.row[0], src, bytes, cudaMemcpyDeviceToDevice));
      });
  std::printf("rows %d, k %s%.2f, %d blocks, %d slots of %d B, %s%s\n", rows,
              routed ? "routed top-8 of 64 experts on 8 ranks: " : "", writes, blocks, slots,
              kRowBytes,
              warps == 2 ? "loader (any free slot) + 4 store warps"
              : warps    ? "loader + 4 store warps"
                         : "one thread",
              ipc_dir != nullptr ? ", copies into the peers through IPC" : "");
  std::printf("%-34s %9.1f GB/s (roofline)\n", "cudaMemcpyAsync 1:1", roofline / 1e9);
  const char* start_at = std::getenv("PROBE_START_AT");  // processes.sh: all copies at once
  const char* gated_gap = std::getenv("PROBE_GATED_GAP_US");
  const char* contiguous_env = std::getenv("PROBE_CONTIGUOUS");
  const int contiguous = contiguous_env != nullptr && std::atoi(contiguous_env) != 0;
  HYBRID_EP_CUDA_CHECK(cudaMemcpyToSymbol(g_contiguous, &contiguous, sizeof(contiguous)));
  if (gated_gap != nullptr && ipc_dir == nullptr) {
    std::fprintf(stderr, "PROBE_GATED_GAP_US needs PROBE_IPC_DIR (processes.sh, PROBE_IPC=1)\n");
    return 2;
  }
  int run_index = 0;
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
    for (int j = 0; j < buffers; ++j) HYBRID_EP_CUDA_CHECK(cudaMemset(dst.row[j], 0, bytes));
    const auto launch = [&] {
      if (warps == 2) {
        any_slot_kernel<<<blocks, 32 * (1 + kStoreWarps), smem>>>(src, dst, rows, k, copies, slots,
                                                                  gate);
      } else if (warps) {
        warps_kernel<<<blocks, 32 * (1 + kStoreWarps), smem>>>(src, dst, rows, k, copies, slots,
                                                               gate);
      } else {
        ring_kernel<<<blocks, 32, smem>>>(src, dst, rows, k, copies, slots, gate);
      }
    };
    if (start_at != nullptr) {
      // One pass of `iters` launches from the common instant, its end on the wall clock: the
      // copies' summed rate is then total bytes / (last end - start). The best-of timing below
      // also runs while the copies drift apart, so its sum may count time some ran alone.
      launch();
      HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
      std::this_thread::sleep_until(std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::duration<double>(std::atof(start_at)))));
      const int traced = std::getenv("PROBE_TRACE") != nullptr ? iters / 2 : -1;
      for (int i = 0; i < iters; ++i) {
        const int on = 1, off = 0;
        if (i == traced) HYBRID_EP_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_trace, &on, sizeof(on)));
        launch();
        if (i == traced) HYBRID_EP_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_trace, &off, sizeof(off)));
      }
      HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
      const double end =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::printf("together: %.0f bytes, end %.6f\n", double(bytes) * (1 + writes) * iters, end);
    }
    if (gated_gap != nullptr) {
      const double launch_s = gated_launch_seconds(launch, ipc, run_index, iters,
                                                   uint64_t(std::atof(gated_gap) * 1000));
      std::printf("gated: %.0f bytes, launch %.9f s\n", double(bytes) * (1 + writes), launch_s);
    }
    ++run_index;
    const double s = seconds(launch);
    HYBRID_EP_CUDA_CHECK(cudaMemset(bad, 0, sizeof(*bad)));
    check<<<512, 256>>>(dst, k, copies, rows, bad);
    unsigned long long wrong = 0;
    HYBRID_EP_CUDA_CHECK(cudaMemcpy(&wrong, bad, sizeof(wrong), cudaMemcpyDeviceToHost));
    const double moved = double(bytes) * (1 + writes);
    std::printf("%-6s P %3d us W %2d us low %d: %9.1f GB/s %6.3f of the roofline%s\n", r.name,
                r.period_us, r.window_us, low, moved / s / 1e9, moved / s / roofline,
                wrong ? "  COPIES WRONG" : "");
  }
  if (ipc_dir != nullptr) ipc.close();
  return 0;
}
