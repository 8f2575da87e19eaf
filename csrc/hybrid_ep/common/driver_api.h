// CUDA driver entry points, fetched at run time through the runtime's
// cudaGetDriverEntryPointByVersion: the build needs no libcuda stub and importing the module
// needs no driver. Only what the fabric (MNNVL) memory path and the eager form's buffer
// attribute (SymmetricBuffer::synchronize_memops) use.
#pragma once

#include <cuda.h>

namespace hybrid_ep::driver {

struct Api {
  decltype(&cuMemCreate) mem_create;
  decltype(&cuMemRelease) mem_release;
  decltype(&cuMemAddressReserve) address_reserve;
  decltype(&cuMemAddressFree) address_free;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&cuMemExportToShareableHandle) export_handle;
  decltype(&cuMemImportFromShareableHandle) import_handle;
  decltype(&cuPointerSetAttribute) pointer_set_attribute;
  decltype(&cuGetErrorString) error_string;
};

// Loaded once; throws CudaError naming the missing entry point.
const Api& api();

// Throws CudaError with the call's text when `status` is not CUDA_SUCCESS.
void check(CUresult status, const char* call);

}  // namespace hybrid_ep::driver
