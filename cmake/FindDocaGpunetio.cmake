# Finds the DOCA GPUNetIO headers the doca transport compiles against (device verbs and the
# host API's declarations; no library is linked: the host library is loaded at run time).
# Looked up, in order:
#   1. DOCA_HOME (CMake or environment variable): an install of the open-source DOCA GPUNetIO
#      (make install PREFIX=...) or its source tree: <DOCA_HOME>/include.
#   2. The nvidia-nvshmem-cu13 wheel (>= 3.8) of the Python that builds: it ships the same
#      headers under nvidia/nvshmem/include/gpunetio.
# Sets DocaGpunetio_FOUND, DocaGpunetio_INCLUDE_DIR, DocaGpunetio_VERSION and the target
# DocaGpunetio::headers.

include(HybridEPLocate)
set(_doca_hints "")
hybrid_ep_home(DOCA_HOME _doca_home)
if(_doca_home)
  list(APPEND _doca_hints "${_doca_home}/include" "${_doca_home}/include/gpunetio")
endif()
hybrid_ep_python_package_dir(nvidia.nvshmem _doca_wheel_dir)
if(_doca_wheel_dir)
  list(APPEND _doca_hints "${_doca_wheel_dir}/include/gpunetio")
endif()

find_path(DocaGpunetio_INCLUDE_DIR
  NAMES doca_gpunetio_device.h
  HINTS ${_doca_hints}
  NO_DEFAULT_PATH)

if(DocaGpunetio_INCLUDE_DIR)
  foreach(_header host/doca_gpunetio_high_level.h host/doca_verbs.h
                  common/doca_gpunetio_verbs_def.h device/doca_gpunetio_dev_verbs_qp.cuh)
    if(NOT EXISTS "${DocaGpunetio_INCLUDE_DIR}/${_header}")
      set(_doca_missing "${_header}")
    endif()
  endforeach()
  file(STRINGS "${DocaGpunetio_INCLUDE_DIR}/common/doca_gpunetio_verbs_def.h" _doca_version
       REGEX "^#define DOCA_GPUNETIO_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*DOCA_GPUNETIO_VERSION_${_part} ([0-9]+).*" "\\1" _doca_${_part}
           "${_doca_version}")
  endforeach()
  set(DocaGpunetio_VERSION "${_doca_MAJOR}.${_doca_MINOR}.${_doca_PATCH}")
endif()

# Joined: a ';' inside the message would split it into arguments of the call below.
list(JOIN _doca_hints ", " _doca_searched)
string(CONCAT _doca_help
  "The doca transport needs the DOCA GPUNetIO headers (doca_gpunetio_device.h with host/, "
  "common/ and device/ beside it). Provide them with `python -m pip install "
  "\"nvidia-nvshmem-cu13>=3.8\"` into the Python that builds (${Python_EXECUTABLE}), or set "
  "DOCA_HOME to an install of the open-source DOCA GPUNetIO (NVIDIA-DOCA/gpunetio, "
  "make install PREFIX=...). Searched: ${_doca_searched}")
if(DocaGpunetio_INCLUDE_DIR AND _doca_missing)
  message(FATAL_ERROR "DOCA GPUNetIO headers at ${DocaGpunetio_INCLUDE_DIR} lack ${_doca_missing}. "
                      ${_doca_help})
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DocaGpunetio
  REQUIRED_VARS DocaGpunetio_INCLUDE_DIR
  VERSION_VAR DocaGpunetio_VERSION
  REASON_FAILURE_MESSAGE "${_doca_help}")

if(DocaGpunetio_FOUND AND NOT TARGET DocaGpunetio::headers)
  add_library(DocaGpunetio::headers INTERFACE IMPORTED)
  set_target_properties(DocaGpunetio::headers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${DocaGpunetio_INCLUDE_DIR}")
endif()
mark_as_advanced(DocaGpunetio_INCLUDE_DIR)
