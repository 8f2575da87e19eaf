# Finds the NIXL runtime the nixl transport's control plane uses at run time (a NIXL agent
# per rank with the UCX backend plugin; hybrid_ep/nixl_control.py drives it from Python).
# Nothing of NIXL is linked: the check is here so that a build meant for NIXL fails at
# configure time, naming what is missing, rather than at the first multi-domain call.
# Looked up, in order:
#   1. NIXL_HOME (CMake or environment variable): a NIXL install with libnixl.so and the UCX
#      plugin libplugin_UCX.so under its lib folders.
#   2. The nixl-cu13 wheel of the Python that builds: nixl_cu13/_bindings*.so and
#      nixl_cu13.libs/nixl/libplugin_UCX.so.
# (The messages hold no ";": it would split them into arguments.)
# Sets Nixl_FOUND, Nixl_RUNTIME (the library or bindings found) and Nixl_UCX_PLUGIN.

include(HybridEPLocate)
set(_nixl_lib_hints "")
set(_nixl_plugin_hints "")
hybrid_ep_home(NIXL_HOME _nixl_home)
if(_nixl_home)
  foreach(_lib lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
    list(APPEND _nixl_lib_hints "${_nixl_home}/${_lib}")
    list(APPEND _nixl_plugin_hints "${_nixl_home}/${_lib}/plugins")
  endforeach()
endif()

set(_nixl_wheel_dir "")
if(NOT _nixl_home)  # its import would load UCX: located, not imported
  hybrid_ep_python_package_dir(nixl_cu13 _nixl_wheel_dir)
endif()
if(_nixl_wheel_dir)
  list(APPEND _nixl_lib_hints "${_nixl_wheel_dir}")
  list(APPEND _nixl_plugin_hints "${_nixl_wheel_dir}/../nixl_cu13.libs/nixl")
endif()

find_library(Nixl_RUNTIME NAMES nixl HINTS ${_nixl_lib_hints} NO_DEFAULT_PATH)
if(NOT Nixl_RUNTIME AND _nixl_lib_hints)
  file(GLOB _nixl_bindings LIST_DIRECTORIES false "${_nixl_wheel_dir}/_bindings*.so")
  if(_nixl_bindings)
    list(GET _nixl_bindings 0 _nixl_first)
    set(Nixl_RUNTIME "${_nixl_first}" CACHE FILEPATH "NIXL runtime (library or bindings)" FORCE)
  endif()
endif()
find_file(Nixl_UCX_PLUGIN NAMES libplugin_UCX.so HINTS ${_nixl_plugin_hints} NO_DEFAULT_PATH)

list(JOIN _nixl_lib_hints ", " _nixl_searched)
list(JOIN _nixl_plugin_hints ", " _nixl_plugin_searched)
string(CONCAT _nixl_help
  "The nixl transport needs the NIXL runtime with its UCX plugin. Provide it with "
  "`python -m pip install \"nixl-cu13==1.5.1\"` into the Python that builds "
  "(${Python_EXECUTABLE}), or set NIXL_HOME to a NIXL install. Searched for the runtime: "
  "${_nixl_searched}, and for libplugin_UCX.so: ${_nixl_plugin_searched}")

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Nixl
  REQUIRED_VARS Nixl_RUNTIME Nixl_UCX_PLUGIN
  REASON_FAILURE_MESSAGE "${_nixl_help}")
mark_as_advanced(Nixl_RUNTIME Nixl_UCX_PLUGIN)
