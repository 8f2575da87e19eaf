# p2p transport: peers' buffers are CUDA-IPC-mapped device memory, written with TMA bulk or
# vector stores. It needs nothing beyond the CUDA toolkit the core already links
# (cudart_static), so there are no extra libraries or definitions, and device code stays
# whole-program (no -rdc). Variables are described in cmake/Transport.cmake.

set(HYBRID_EP_BACKEND_NAME "p2p")
# The host side of the transport contract (the device side is transport_backend.cuh).
set(HYBRID_EP_BACKEND_SOURCES "${CMAKE_CURRENT_LIST_DIR}/transport_backend.cpp"
                               "${CMAKE_CURRENT_LIST_DIR}/wire_model.cpp")
# The backend's device header is included by a fixed name from this folder.
set(HYBRID_EP_BACKEND_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}")
set(HYBRID_EP_BACKEND_LINK_LIBRARIES "")
set(HYBRID_EP_BACKEND_COMPILE_DEFINITIONS "")
set(HYBRID_EP_BACKEND_CUDA_RDC OFF)
