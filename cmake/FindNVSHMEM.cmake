# Finds the NVSHMEM the nvshmem transport compiles and links against. Looked up, in order:
#   1. NVSHMEM_HOME (CMake or environment variable): an NVSHMEM install (include/, lib/).
#   2. The nvidia-nvshmem-cu13 wheel of the Python that builds (nvidia/nvshmem/{include,lib}).
# The wheel ships neither CMake config files nor an unversioned libnvshmem_host.so, so the
# libraries are imported by file, never by -l.
# Sets NVSHMEM_FOUND, NVSHMEM_INCLUDE_DIR, NVSHMEM_LIBRARY_DIR, NVSHMEM_VERSION (and
# NVSHMEM_VERSION_MAJOR/_MINOR/_PATCH) and the targets:
#   NVSHMEM::device  STATIC: libnvshmem_device.a (device API, nvshmemi_init_thread), relocatable
#                    device code: whoever links it needs -rdc and a device link.
#   NVSHMEM::host    SHARED: libnvshmem_host.so.3 (bootstrap, heap, transports). Link it only
#                    into the final module: a shared library on nvcc's device-link line breaks
#                    the device link.

include(HybridEPLocate)
set(_nvshmem_roots "")
hybrid_ep_home(NVSHMEM_HOME _nvshmem_home)
if(_nvshmem_home)
  list(APPEND _nvshmem_roots "${_nvshmem_home}")
endif()
set(NVSHMEM_FROM_WHEEL OFF)
hybrid_ep_python_package_dir(nvidia.nvshmem _nvshmem_wheel_dir)
if(_nvshmem_wheel_dir)
  list(APPEND _nvshmem_roots "${_nvshmem_wheel_dir}")
endif()

set(_nvshmem_include_hints "")
set(_nvshmem_lib_hints "")
foreach(_root IN LISTS _nvshmem_roots)
  list(APPEND _nvshmem_include_hints "${_root}/include")
  list(APPEND _nvshmem_lib_hints "${_root}/lib" "${_root}/lib64")
endforeach()

find_path(NVSHMEM_INCLUDE_DIR NAMES nvshmem.h non_abi/nvshmem_version.h
  HINTS ${_nvshmem_include_hints} NO_DEFAULT_PATH)
find_file(NVSHMEM_DEVICE_LIBRARY NAMES libnvshmem_device.a
  HINTS ${_nvshmem_lib_hints} NO_DEFAULT_PATH)
find_file(NVSHMEM_HOST_LIBRARY NAMES libnvshmem_host.so.3
  HINTS ${_nvshmem_lib_hints} NO_DEFAULT_PATH)

if(NVSHMEM_INCLUDE_DIR AND EXISTS "${NVSHMEM_INCLUDE_DIR}/non_abi/nvshmem_version.h")
  file(STRINGS "${NVSHMEM_INCLUDE_DIR}/non_abi/nvshmem_version.h" _nvshmem_version
       REGEX "^#define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*NVSHMEM_VENDOR_${_part}_VERSION ([0-9]+).*" "\\1"
           NVSHMEM_VERSION_${_part} "${_nvshmem_version}")
  endforeach()
  set(NVSHMEM_VERSION
      "${NVSHMEM_VERSION_MAJOR}.${NVSHMEM_VERSION_MINOR}.${NVSHMEM_VERSION_PATCH}")
endif()
if(NVSHMEM_HOST_LIBRARY)
  get_filename_component(NVSHMEM_LIBRARY_DIR "${NVSHMEM_HOST_LIBRARY}" DIRECTORY)
  if(_nvshmem_wheel_dir AND NVSHMEM_LIBRARY_DIR STREQUAL "${_nvshmem_wheel_dir}/lib")
    set(NVSHMEM_FROM_WHEEL ON)
  endif()
endif()

# Joined: a ';' inside the message would split it into arguments of the call below.
list(JOIN _nvshmem_roots ", " _nvshmem_searched)
if(NOT _nvshmem_searched)
  set(_nvshmem_searched "nothing (no NVSHMEM_HOME, no nvidia-nvshmem-cu13 wheel)")
endif()
set(_nvshmem_missing "")
foreach(_var NVSHMEM_INCLUDE_DIR NVSHMEM_DEVICE_LIBRARY NVSHMEM_HOST_LIBRARY)
  if(NOT ${_var})
    list(APPEND _nvshmem_missing "${_var}")
  endif()
endforeach()
string(REPLACE ";" ", " _nvshmem_missing "${_nvshmem_missing}")
string(CONCAT _nvshmem_help
  "The nvshmem transport needs NVSHMEM's headers (nvshmem.h, non_abi/nvshmem_version.h), "
  "lib/libnvshmem_device.a and lib/libnvshmem_host.so.3 (not found: ${_nvshmem_missing}). "
  "Install them with `python -m pip install nvidia-nvshmem-cu13` into the Python that builds "
  "(${Python_EXECUTABLE}), at the version the run-time environment uses (a CUDA torch pins "
  "one: `pip show nvidia-nvshmem-cu13` there), or set NVSHMEM_HOME to an NVSHMEM install. "
  "Searched: ${_nvshmem_searched}")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NVSHMEM
  REQUIRED_VARS NVSHMEM_INCLUDE_DIR NVSHMEM_DEVICE_LIBRARY NVSHMEM_HOST_LIBRARY
  VERSION_VAR NVSHMEM_VERSION
  REASON_FAILURE_MESSAGE "${_nvshmem_help}")

if(NVSHMEM_FOUND AND NOT TARGET NVSHMEM::device)
  add_library(NVSHMEM::device STATIC IMPORTED)
  set_target_properties(NVSHMEM::device PROPERTIES
    IMPORTED_LOCATION "${NVSHMEM_DEVICE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_INCLUDE_DIR}")
  add_library(NVSHMEM::host SHARED IMPORTED)
  set_target_properties(NVSHMEM::host PROPERTIES
    IMPORTED_LOCATION "${NVSHMEM_HOST_LIBRARY}"
    IMPORTED_SONAME "libnvshmem_host.so.3"
    INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_INCLUDE_DIR}")
endif()
mark_as_advanced(NVSHMEM_INCLUDE_DIR NVSHMEM_DEVICE_LIBRARY NVSHMEM_HOST_LIBRARY)
