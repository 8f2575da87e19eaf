# Finds UCX's GPU device API headers (ucp/api/device/ucp_device_impl.h and what it includes),
# which the nixl transport's device code compiles against. Header-only on the device side; no
# UCX library is linked (the NIXL runtime brings its own UCX and creates the memory views).
# Looked up, in order:
#   1. UCX_HOME (CMake or environment variable): a UCX install, <UCX_HOME>/include. Only a
#      UCX built with InfiniBand (mlx5dv.h at hand) adds the GPU-direct-async device code.
#   2. The libucx-cu13 wheel of the Python that builds (libucx/include): cuda_ipc device code.
# Sets UcxDevice_FOUND, UcxDevice_INCLUDE_DIR, UcxDevice_VERSION.

include(HybridEPLocate)
set(_ucx_hints "")
hybrid_ep_home(UCX_HOME _ucx_home)
if(_ucx_home)
  list(APPEND _ucx_hints "${_ucx_home}/include")
endif()
hybrid_ep_python_package_dir(libucx _ucx_wheel_dir)
if(_ucx_wheel_dir)
  list(APPEND _ucx_hints "${_ucx_wheel_dir}/include")
endif()

find_path(UcxDevice_INCLUDE_DIR
  NAMES ucp/api/device/ucp_device_impl.h
  HINTS ${_ucx_hints}
  NO_DEFAULT_PATH)

set(_ucx_missing "")
if(UcxDevice_INCLUDE_DIR)
  foreach(_header ucp/api/device/ucp_device_types.h uct/api/device/uct_device_impl.h
                  uct/cuda/cuda_ipc/cuda_ipc.cuh ucs/sys/device_code.h ucp/api/ucp_version.h)
    if(NOT EXISTS "${UcxDevice_INCLUDE_DIR}/${_header}")
      list(APPEND _ucx_missing "${_header}")
    endif()
  endforeach()
  if(EXISTS "${UcxDevice_INCLUDE_DIR}/ucp/api/ucp_version.h")
    file(STRINGS "${UcxDevice_INCLUDE_DIR}/ucp/api/ucp_version.h" _ucx_version
         REGEX "^#define UCP_API_(MAJOR|MINOR) +[0-9]+")
    foreach(_part MAJOR MINOR)
      string(REGEX REPLACE ".*UCP_API_${_part} +([0-9]+).*" "\\1" _ucx_${_part} "${_ucx_version}")
    endforeach()
    set(UcxDevice_VERSION "${_ucx_MAJOR}.${_ucx_MINOR}")
  endif()
endif()

list(JOIN _ucx_hints ", " _ucx_searched)
string(CONCAT _ucx_help
  "The nixl transport needs UCX's GPU device API headers (ucp/api/device/ucp_device_impl.h). "
  "Provide them with `python -m pip install \"libucx-cu13==1.22.0\"` into the Python that "
  "builds (${Python_EXECUTABLE}), or set UCX_HOME to a UCX install (>= 1.22, built with CUDA). "
  "Searched: ${_ucx_searched}")
if(UcxDevice_INCLUDE_DIR AND _ucx_missing)
  list(JOIN _ucx_missing ", " _ucx_missing_text)
  message(FATAL_ERROR "UCX headers at ${UcxDevice_INCLUDE_DIR} lack ${_ucx_missing_text}. "
                      ${_ucx_help})
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(UcxDevice
  REQUIRED_VARS UcxDevice_INCLUDE_DIR
  VERSION_VAR UcxDevice_VERSION
  REASON_FAILURE_MESSAGE "${_ucx_help}")
mark_as_advanced(UcxDevice_INCLUDE_DIR)
