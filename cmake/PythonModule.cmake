# What every pybind11 module of this repository shares (hybrid_ep._C and the benchmark's
# hybrid_ep_bench._C): finding pybind11 for the building Python, and the link rules that keep
# the module importable next to torch.

find_package(Python 3.10 REQUIRED COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG QUIET)
if(NOT pybind11_FOUND)
  # Plain CMake builds: ask the interpreter's pybind11 where its CMake files are.
  execute_process(COMMAND "${Python_EXECUTABLE}" -m pybind11 --cmakedir
                  OUTPUT_VARIABLE _pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pybind11 not found for ${Python_EXECUTABLE}: "
                        "run `${Python_EXECUTABLE} -m pip install pybind11`.")
  endif()
  find_package(pybind11 CONFIG REQUIRED PATHS "${_pybind11_dir}" NO_DEFAULT_PATH)
endif()

# Keep symbols from static archives (cudart_static included) out of the module's dynamic
# symbol table, so they can never interpose on the libcudart that torch loads; and check after
# the link that libstdc++ is shared and libcuda absent (cmake/CheckLinkage.cmake).
function(hybrid_ep_module_link_rules target)
  target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  if(CMAKE_READELF)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND "${CMAKE_COMMAND}" -DREADELF=${CMAKE_READELF} -DMODULE=$<TARGET_FILE:${target}>
              -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/CheckLinkage.cmake"
      COMMENT "Checking ${target} links libstdc++.so.6 dynamically and not libcuda"
      VERBATIM)
  endif()
endfunction()
