# nixl transport: NIXL agents (Python, hybrid_ep/nixl_control.py) register the buffer and
# prepare UCX memory views; the GPU puts and adds through UCX's device API on those views.
# Compiles against UCX's device headers (cmake/FindUcxDevice.cmake: UCX_HOME or the
# libucx-cu13 wheel) and checks that the NIXL runtime is there (cmake/FindNixl.cmake: NIXL_HOME
# or the nixl-cu13 wheel). No UCX or NIXL library is linked: the device API is header-only
# and the views are made by the NIXL runtime of the Python process. Device code stays
# whole-program. Variables are described in cmake/Transport.cmake.

find_package(UcxDevice 1.22 REQUIRED)
find_package(Nixl REQUIRED)
message(STATUS "hybrid-ep: UCX device headers ${UcxDevice_INCLUDE_DIR}; NIXL ${Nixl_RUNTIME}")

set(HYBRID_EP_BACKEND_NAME "nixl")
set(HYBRID_EP_BACKEND_SOURCES "${CMAKE_CURRENT_LIST_DIR}/transport_backend.cpp"
                               "${CMAKE_CURRENT_LIST_DIR}/mapped_views.cu")
set(HYBRID_EP_BACKEND_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}" "${UcxDevice_INCLUDE_DIR}")
set(HYBRID_EP_BACKEND_LINK_LIBRARIES "")
# Parameter checks inside ucp_device_* print from device code; our own checks run at connect.
set(HYBRID_EP_BACKEND_COMPILE_DEFINITIONS "UCP_DEVICE_ENABLE_PARAMS_CHECK=0")
set(HYBRID_EP_BACKEND_CUDA_RDC OFF)
