#include "hybrid_ep/memory/symmetric_buffer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>
#include <utility>

#include "hybrid_ep/common/cuda_check.h"
#include "hybrid_ep/common/driver_api.h"

namespace hybrid_ep {
namespace {

#define HYBRID_EP_CU_CHECK(call) ::hybrid_ep::driver::check((call), #call)

// CUDA IPC allocations are whole multiples of this (torch's allocator rounds large ones alike).
constexpr size_t kIpcPageBytes = size_t(2) << 20;

CUmemAllocationProp fabric_properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  return prop;
}

size_t fabric_granularity(const CUmemAllocationProp& prop) {
  size_t granularity = 0;
  HYBRID_EP_CU_CHECK(
      driver::api().granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return granularity;
}

// Reserves, maps and enables read/write access for `device` over an allocation handle.
uint8_t* map_fabric(CUmemGenericAllocationHandle handle, size_t bytes, size_t granularity,
                    int device) {
  const driver::Api& d = driver::api();
  CUdeviceptr address = 0;
  HYBRID_EP_CU_CHECK(d.address_reserve(&address, bytes, granularity, 0, 0));
  HYBRID_EP_CU_CHECK(d.map(address, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  HYBRID_EP_CU_CHECK(d.set_access(address, bytes, &access, 1));
  return reinterpret_cast<uint8_t*>(address);
}

void unmap_fabric(uint8_t* address, size_t bytes) noexcept {
  const driver::Api& d = driver::api();
  const auto base = reinterpret_cast<CUdeviceptr>(address);
  d.unmap(base, bytes);
  d.address_free(base, bytes);
}

int current_device() {
  int device = 0;
  HYBRID_EP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace

SymmetricBuffer::SymmetricBuffer(size_t bytes, HandleKind kind) : bytes_(bytes), kind_(kind) {
  if (kind_ == HandleKind::kCudaIpc) {
    // Peers write through CUDA IPC mappings of this allocation. Measured on H200: when its size
    // is not a whole number of large pages, writes through those mappings run at half the
    // bandwidth of local ones (benchmarks/results/2026-12-01-ipc-page-rounding.md).
    bytes_ = (bytes_ + kIpcPageBytes - 1) / kIpcPageBytes * kIpcPageBytes;
    HYBRID_EP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&local_), bytes_));
  } else {
    const int device = current_device();
    const CUmemAllocationProp prop = fabric_properties(device);
    const size_t granularity = fabric_granularity(prop);
    bytes_ = (bytes_ + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    HYBRID_EP_CU_CHECK(driver::api().mem_create(&handle, bytes_, &prop, 0));
    local_handle_ = handle;
    local_ = map_fabric(handle, bytes_, granularity, device);
  }
  // Flags live in this buffer: they must start at zero.
  HYBRID_EP_CUDA_CHECK(cudaMemset(local_, 0, bytes_));
  HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
}

SymmetricBuffer::SymmetricBuffer(ExternalMemory memory)
    : bytes_(memory.bytes), kind_(HandleKind::kExternal), external_(std::move(memory)) {
  local_ = external_.base;
  if (local_ == nullptr || !external_.peer || !external_.release) {
    throw std::invalid_argument("SymmetricBuffer: external memory needs a base, peer and release");
  }
  try {
    HYBRID_EP_CUDA_CHECK(cudaMemset(local_, 0, bytes_));
    HYBRID_EP_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (...) {
    external_.release(false);
    throw;
  }
}

void SymmetricBuffer::synchronize_memops() {
  if (kind_ != HandleKind::kCudaIpc) return;
  unsigned int on = 1;
  HYBRID_EP_CU_CHECK(driver::api().pointer_set_attribute(&on, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                                         CUdeviceptr(local_)));
}

SymmetricBuffer::~SymmetricBuffer() {
  close_peers();
  if (kind_ == HandleKind::kExternal) {
    external_.release(collective_release_);
  } else if (kind_ == HandleKind::kCudaIpc) {
    cudaFree(local_);
  } else if (local_ != nullptr) {
    unmap_fabric(local_, bytes_);
    driver::api().mem_release(local_handle_);
  }
}

std::string SymmetricBuffer::export_handle() const {
  if (kind_ == HandleKind::kExternal) return std::string();
  if (kind_ == HandleKind::kCudaIpc) {
    cudaIpcMemHandle_t handle;
    HYBRID_EP_CUDA_CHECK(cudaIpcGetMemHandle(&handle, local_));
    return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  CUmemFabricHandle handle;
  HYBRID_EP_CU_CHECK(
      driver::api().export_handle(&handle, local_handle_, CU_MEM_HANDLE_TYPE_FABRIC, 0));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

PeerMapping map_peer(HandleKind kind, const std::string& handle, size_t bytes,
                     const std::string& who) {
  PeerMapping mapping;
  if (kind == HandleKind::kExternal) {
    throw std::invalid_argument("external memory has no handle to map (" + who + ")");
  }
  if (kind == HandleKind::kCudaIpc) {
    cudaIpcMemHandle_t ipc;
    if (handle.size() != sizeof(ipc)) {
      throw std::invalid_argument("malformed CUDA IPC handle of " + who);
    }
    std::memcpy(&ipc, handle.data(), sizeof(ipc));
    void* address = nullptr;
    HYBRID_EP_CUDA_CHECK(cudaIpcOpenMemHandle(&address, ipc, cudaIpcMemLazyEnablePeerAccess));
    mapping.address = static_cast<uint8_t*>(address);
    return mapping;
  }
  CUmemFabricHandle fabric;
  if (handle.size() != sizeof(fabric)) {
    throw std::invalid_argument("malformed fabric handle of " + who);
  }
  std::memcpy(&fabric, handle.data(), sizeof(fabric));
  CUmemGenericAllocationHandle imported = 0;
  HYBRID_EP_CU_CHECK(driver::api().import_handle(&imported, &fabric, CU_MEM_HANDLE_TYPE_FABRIC));
  mapping.imported = imported;
  const int device = current_device();
  const CUmemAllocationProp prop = fabric_properties(device);
  mapping.address = map_fabric(imported, bytes, fabric_granularity(prop), device);
  return mapping;
}

void unmap_peer(HandleKind kind, const PeerMapping& mapping, size_t bytes) noexcept {
  if (mapping.address == nullptr || kind == HandleKind::kExternal) return;
  if (kind == HandleKind::kCudaIpc) {
    cudaIpcCloseMemHandle(mapping.address);
  } else {
    unmap_fabric(mapping.address, bytes);
    driver::api().mem_release(mapping.imported);
  }
}

void SymmetricBuffer::open_peers(const std::vector<std::string>& handles, int self) {
  close_peers();
  self_ = self;
  peers_.assign(handles.size(), nullptr);
  mappings_.assign(handles.size(), PeerMapping{});
  for (size_t j = 0; j < handles.size(); ++j) {
    if (int(j) == self) {
      peers_[j] = local_;  // a process cannot open its own IPC handle
      continue;
    }
    if (kind_ == HandleKind::kExternal) {
      peers_[j] = external_.peer(int(j));
      continue;
    }
    mappings_[j] = map_peer(kind_, handles[j], bytes_, "local rank " + std::to_string(j));
    peers_[j] = mappings_[j].address;
  }
  HYBRID_EP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&peer_table_), sizeof(uint8_t*) * peers_.size()));
  HYBRID_EP_CUDA_CHECK(cudaMemcpy(peer_table_, peers_.data(), sizeof(uint8_t*) * peers_.size(),
                                  cudaMemcpyHostToDevice));
}

void SymmetricBuffer::close_peers() noexcept {
  for (const PeerMapping& mapping : mappings_) unmap_peer(kind_, mapping, bytes_);
  peers_.clear();
  mappings_.clear();
  if (peer_table_ != nullptr) cudaFree(peer_table_);
  peer_table_ = nullptr;
}

}  // namespace hybrid_ep
