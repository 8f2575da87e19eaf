// TMA copy ceiling (benchmark only): persistent, one CTA per SM, single-lane roles.
//   loader lane  (warp 0)    : cp.async.bulk loads of rows into an N-stage shared-memory ring,
//                              one stage per row, full/empty mbarriers per stage;
//   store lanes  (warps 1..L): output group n belongs to lane n % L; once its rows are in, the
//                              lane issues its cp.async.bulk stores from the ring as one bulk
//                              group; every `release_every` groups it waits until at most
//                              `in_flight` of its groups still read shared memory and hands the
//                              stages of the older ones back to the loader.
// One store lane stalls per group (~50 GB/s of traffic per SM with 14 KB rows on an H200, for
// 1 load : 1 store); two or more reach ~100, which is why L is a parameter.
// fan-out (dispatch pattern): source row i -> destination rows (j * rows + i), j < k.
// fan-in  (combine pattern) : source rows (j * rows + i), j < k -> destination row i; the store
//                             waits for all k loads and writes the first (no arithmetic: the
//                             reduction is what the combine kernel adds on top).
// Rows go to blocks round-robin (row i to block i % gridDim.x).
#include <stdexcept>
#include <string>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/device_info.h"
#include "hybrid_ep/common/ptx.cuh"
#include "hybrid_ep/kernels/common/launch.h"
#include "hybrid_ep_bench/copy_ceiling.h"

namespace hybrid_ep {
namespace {

constexpr int kMaxStoreLanes = 4;
constexpr int kThreads = 32 * (1 + kMaxStoreLanes);  // warp 0: loader lane, warps 1..: stores
constexpr int kMaxInFlight = 7;

__host__ __device__ __forceinline__ int ring_stride(int row_bytes) {
  return (row_bytes + 127) / 128 * 128;
}

// cp.async.bulk.wait_group.read takes an immediate.
__device__ __forceinline__ void wait_read_upto(int pending) {
  switch (pending) {
    case 0:
      ptx::bulk_wait_read<0>();
      break;
    case 1:
      ptx::bulk_wait_read<1>();
      break;
    case 2:
      ptx::bulk_wait_read<2>();
      break;
    case 3:
      ptx::bulk_wait_read<3>();
      break;
    case 4:
      ptx::bulk_wait_read<4>();
      break;
    case 5:
      ptx::bulk_wait_read<5>();
      break;
    case 6:
      ptx::bulk_wait_read<6>();
      break;
    default:
      ptx::bulk_wait_read<kMaxInFlight>();
      break;
  }
}

__device__ void load_rows(const CopyCeilingParams& p, uint8_t* ring, uint64_t* full,
                          uint64_t* empty) {
  const int stride = ring_stride(p.row_bytes);
  const int loads = p.fan_in ? p.k : 1;
  uint32_t item = 0;
  for (int64_t i = blockIdx.x; i < p.rows; i += gridDim.x) {
    for (int j = 0; j < loads; ++j, ++item) {
      const int stage = int(item % uint32_t(p.stages));
      ptx::mbar_wait(&empty[stage], ((item / uint32_t(p.stages)) & 1) ^ 1);
      ptx::mbar_arrive_expect_tx(&full[stage], uint32_t(p.row_bytes));
      const int64_t row = int64_t(j) * p.rows + i;
      ptx::bulk_load(ring + size_t(stage) * stride, p.src + row * p.row_bytes,
                     uint32_t(p.row_bytes), &full[stage]);
    }
  }
}

// Store lane `lane` of `lanes`: output groups lane, lane + lanes, ... (group n is row
// blockIdx.x + n * gridDim.x of this block, its loads ring items n * loads ...).
__device__ void store_rows(const CopyCeilingParams& p, uint8_t* ring, uint64_t* full,
                           uint64_t* empty, int lane) {
  const int stride = ring_stride(p.row_bytes);
  const uint32_t loads = p.fan_in ? uint32_t(p.k) : 1u;
  const uint32_t stages = uint32_t(p.stages);
  const uint32_t lanes = uint32_t(p.store_lanes);
  const uint32_t in_flight = uint32_t(p.in_flight);
  uint32_t committed = 0;  // groups of this lane committed so far
  uint32_t released = 0;   // groups of this lane whose stages went back to the loader
  for (int64_t i = blockIdx.x + int64_t(lane) * gridDim.x; i < p.rows;
       i += int64_t(lanes) * gridDim.x) {
    const uint32_t first = (uint32_t(lane) + committed * lanes) * loads;
    for (uint32_t j = 0; j < loads; ++j) {
      const uint32_t item = first + j;
      ptx::mbar_wait(&full[item % stages], (item / stages) & 1);
    }
    const uint8_t* row = ring + size_t(first % stages) * stride;
    if (p.fan_in) {
      ptx::bulk_store(p.dst + i * p.row_bytes, row, uint32_t(p.row_bytes));
    } else if (p.copy_dst[0] != nullptr) {
#pragma unroll  // constant indices keep copy_dst in parameter space
      for (int j = 0; j < kMaxCopyDestinations; ++j) {
        if (j < p.k) ptx::bulk_store(p.copy_dst[j] + i * p.row_bytes, row, uint32_t(p.row_bytes));
      }
    } else {
      for (int j = 0; j < p.k; ++j) {
        ptx::bulk_store(p.dst + (int64_t(j) * p.rows + i) * p.row_bytes, row,
                        uint32_t(p.row_bytes));
      }
    }
    ptx::bulk_commit();
    ++committed;
    if (committed % uint32_t(p.release_every) == 0) {
      // At most `in_flight` of this lane's groups may still read: the older ones are done
      // with their stages.
      wait_read_upto(p.in_flight);
      for (; released + in_flight < committed; ++released) {
        const uint32_t done = (uint32_t(lane) + released * lanes) * loads;
        for (uint32_t j = 0; j < loads; ++j) ptx::mbar_arrive(&empty[(done + j) % stages]);
      }
    }
  }
  // Every store performed before the CTA (and its shared memory) goes away.
  ptx::bulk_wait<0>();
}

__global__ void __launch_bounds__(kThreads, 1) copy_ceiling_kernel(CopyCeilingParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(ring_stride(p.row_bytes)) * p.stages);
  uint64_t* empty = full + p.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      ptx::mbar_init(&full[s], 1);
      ptx::mbar_init(&empty[s], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 != 0) return;
  if (warp == 0) {
    load_rows(p, ring, full, empty);
  } else if (warp <= p.store_lanes) {
    store_rows(p, ring, full, empty, warp - 1);
  }
}

[[noreturn]] void reject(const std::string& what) {
  throw std::invalid_argument("copy_ceiling: " + what);
}

}  // namespace

int copy_ceiling_min_stages(int loads, int store_lanes, int in_flight, int release_every) {
  // Each store lane may hold up to in_flight + release_every groups' stages unreleased while it
  // waits for its next group; the loader must still be able to fill that group.
  return loads * store_lanes * (in_flight + release_every);
}

size_t copy_ceiling_smem_bytes(int row_bytes, int stages) {
  return size_t(ring_stride(row_bytes)) * stages + 2 * sizeof(uint64_t) * stages;
}

int copy_ceiling_max_stages(int row_bytes) {
  if (row_bytes <= 0) reject("row_bytes must be positive");
  const int per_stage = ring_stride(row_bytes) + 2 * int(sizeof(uint64_t));
  return (max_shared_memory_per_block() - 1024) / per_stage;
}

void launch_copy_ceiling(const CopyCeilingParams& p, int blocks, cudaStream_t stream) {
  if (p.row_bytes <= 0 || p.row_bytes % 16 != 0 || p.row_bytes >= (1 << 20)) {
    reject("row_bytes=" + std::to_string(p.row_bytes) +
           ": expected a positive multiple of 16 below 1 MiB");
  }
  if (p.k < 1) reject("k=" + std::to_string(p.k) + ": expected >= 1");
  if (p.rows < 0) reject("rows must be >= 0");
  if (blocks < 1) reject("blocks must be >= 1");
  if (p.in_flight < 0 || p.in_flight > kMaxInFlight) {
    reject("in_flight=" + std::to_string(p.in_flight) + ": expected 0.." +
           std::to_string(kMaxInFlight));
  }
  if (p.store_lanes < 1 || p.store_lanes > kMaxStoreLanes) {
    reject("store_lanes=" + std::to_string(p.store_lanes) + ": expected 1.." +
           std::to_string(kMaxStoreLanes));
  }
  if (p.release_every < 1) reject("release_every must be >= 1");
  const int needed =
      copy_ceiling_min_stages(p.fan_in ? p.k : 1, p.store_lanes, p.in_flight, p.release_every);
  if (p.stages < needed) {
    reject("stages=" + std::to_string(p.stages) + ": at least " + std::to_string(needed) +
           " are needed (loads per row x store_lanes x (in_flight + release_every))");
  }
  if ((reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst)) % 16 != 0) {
    reject("src and dst must be 16-byte aligned");
  }
  if (p.copy_dst[0] != nullptr) {
    if (p.fan_in || p.k > kMaxCopyDestinations) {
      reject("copy_dst: only for fan-out with k <= " + std::to_string(kMaxCopyDestinations));
    }
    for (int j = 0; j < p.k; ++j) {
      if (p.copy_dst[j] == nullptr || reinterpret_cast<uintptr_t>(p.copy_dst[j]) % 16 != 0) {
        reject("copy_dst[" + std::to_string(j) + "]: expected a 16-byte aligned address");
      }
    }
  }
  if (p.rows == 0) return;
  const size_t smem = copy_ceiling_smem_bytes(p.row_bytes, p.stages);
  if (smem > size_t(max_shared_memory_per_block())) {
    reject("a ring of " + std::to_string(p.stages) + " rows of " + std::to_string(p.row_bytes) +
           " bytes does not fit in shared memory");
  }
  allow_dynamic_smem(reinterpret_cast<const void*>(copy_ceiling_kernel), smem);
  copy_ceiling_kernel<<<blocks, kThreads, smem, stream>>>(p);
  HYBRID_EP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hybrid_ep
