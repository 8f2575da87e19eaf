# doca transport: GPU-initiated RDMA through DOCA GPUNetIO device verbs, for ConnectX NICs.
# Compiles against the DOCA GPUNetIO headers (cmake/FindDocaGpunetio.cmake: DOCA_HOME or the
# nvidia-nvshmem-cu13 wheel) and links no DOCA or rdma-core library: libdoca_gpunetio_host,
# libibverbs and libmlx5 are loaded at run time (doca_library.cpp), so only dlopen is linked.
# The device verbs are header-only inline functions, so device code stays whole-program.
# Variables are described in cmake/Transport.cmake.

find_package(DocaGpunetio 4.0 REQUIRED)

set(HYBRID_EP_BACKEND_NAME "doca")
set(HYBRID_EP_BACKEND_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/doca_library.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/nic.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/network.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/options.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/transport_backend.cpp")
set(HYBRID_EP_BACKEND_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}" "${DocaGpunetio_INCLUDE_DIR}")
set(HYBRID_EP_BACKEND_LINK_LIBRARIES ${CMAKE_DL_LIBS})
set(HYBRID_EP_BACKEND_COMPILE_DEFINITIONS "")
set(HYBRID_EP_BACKEND_CUDA_RDC OFF)
