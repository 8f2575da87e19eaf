#include "hybrid_ep/common/driver_api.h"

#include <cuda_runtime_api.h>

#include <string>

#include "hybrid_ep/common/cuda_check.h"

namespace hybrid_ep::driver {
namespace {

template <typename Fn>
void load(Fn& fn, const char* name) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found{};
  HYBRID_EP_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion(name, &address, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    throw CudaError(cudaErrorSymbolNotFound,
                    std::string("CUDA driver entry point ") + name + " is not available");
  }
  fn = reinterpret_cast<Fn>(address);
}

Api load_all() {
  Api a{};
  load(a.mem_create, "cuMemCreate");
  load(a.mem_release, "cuMemRelease");
  load(a.address_reserve, "cuMemAddressReserve");
  load(a.address_free, "cuMemAddressFree");
  load(a.map, "cuMemMap");
  load(a.unmap, "cuMemUnmap");
  load(a.set_access, "cuMemSetAccess");
  load(a.granularity, "cuMemGetAllocationGranularity");
  load(a.export_handle, "cuMemExportToShareableHandle");
  load(a.import_handle, "cuMemImportFromShareableHandle");
  load(a.pointer_set_attribute, "cuPointerSetAttribute");
  load(a.error_string, "cuGetErrorString");
  return a;
}

}  // namespace

const Api& api() {
  static const Api loaded = load_all();
  return loaded;
}

void check(CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return;
  const char* text = nullptr;
  api().error_string(status, &text);
  throw CudaError(cudaErrorUnknown, std::string(call) + " failed: CUresult " +
                                        std::to_string(int(status)) + " (" +
                                        (text ? text : "unknown") + ")");
}

}  // namespace hybrid_ep::driver
