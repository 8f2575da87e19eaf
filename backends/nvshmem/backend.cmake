# nvshmem transport: the transport contract on NVSHMEM's device API (IBGDA between hosts, P2P
# load/store on one host). Compiles against NVSHMEM's headers and links its two libraries
# (cmake/FindNVSHMEM.cmake: NVSHMEM_HOME or the nvidia-nvshmem-cu13 wheel):
#  - libnvshmem_device.a into the core: its device functions are not all inlined and every
#    kernel reaches its __constant__ state, so every TU of the core that inlines
#    TransportDevice needs relocatable device code (-rdc is per target: the whole core), and
#    _C device-links the core with it;
#  - libnvshmem_host.so.3 into the final module only (a shared library on the device-link line
#    breaks the device link). _C finds it through its RUNPATH: the wheel's folder next to the
#    installed package ($ORIGIN/../nvidia/nvshmem/lib), the absolute folder otherwise.
# Variables are described in cmake/Transport.cmake.

# 3.0: the unique-id bootstrap and the init path used here. The GPU machine builds with 3.4.5
# (torch's pin), this one with 3.8: only APIs both have are used.
find_package(NVSHMEM 3.0 REQUIRED)

set(HYBRID_EP_BACKEND_NAME "nvshmem")
set(HYBRID_EP_BACKEND_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/status.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/session.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/transport_backend.cpp")
set(HYBRID_EP_BACKEND_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}" "${NVSHMEM_INCLUDE_DIR}")
set(HYBRID_EP_BACKEND_LINK_LIBRARIES NVSHMEM::device ${CMAKE_DL_LIBS})
set(HYBRID_EP_BACKEND_COMPILE_DEFINITIONS "")
set(HYBRID_EP_BACKEND_CUDA_RDC ON)
set(HYBRID_EP_BACKEND_MODULE_LINK_LIBRARIES NVSHMEM::host)
set(HYBRID_EP_BACKEND_BUILD_RPATH "${NVSHMEM_LIBRARY_DIR}")
if(NVSHMEM_FROM_WHEEL)
  set(HYBRID_EP_BACKEND_INSTALL_RPATH "$ORIGIN/../nvidia/nvshmem/lib")
else()
  set(HYBRID_EP_BACKEND_INSTALL_RPATH "${NVSHMEM_LIBRARY_DIR}")
endif()
set(HYBRID_EP_BACKEND_LIBRARY "NVSHMEM ${NVSHMEM_VERSION} (${NVSHMEM_LIBRARY_DIR})")
