# Where the transport find modules look for a library: an install the user names, or a pip
# wheel of the Python that builds.

# The install named by <var>: the CMake variable, else the environment variable of that name;
# empty when neither is set.
function(hybrid_ep_home var out)
  if(DEFINED ${var})
    set(${out} "${${var}}" PARENT_SCOPE)
  elseif(DEFINED ENV{${var}})
    set(${out} "$ENV{${var}}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# The folder of Python package <package> (namespace packages too) for the Python that builds,
# located without importing it (some wheels load their libraries on import); empty when that
# Python lacks it.
function(hybrid_ep_python_package_dir package out)
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.10 QUIET COMPONENTS Interpreter)
  endif()
  set(_dir "")
  if(Python_EXECUTABLE)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import importlib.util as u; print(list(u.find_spec('${package}').submodule_search_locations)[0])"
      OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _rc ERROR_QUIET)
    if(NOT _rc EQUAL 0)
      set(_dir "")
    endif()
  endif()
  set(${out} "${_dir}" PARENT_SCOPE)
endfunction()
