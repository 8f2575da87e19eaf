# Post-build check of the extension's dynamic section, run as
#   cmake -DREADELF=<readelf> -DMODULE=<file> -P CheckLinkage.cmake
# It turns two import-time failures into build errors:
#  - libstdc++ must be a shared dependency (a static copy next to torch's crashed at import);
#  - libcuda must not be: `import hybrid_ep._C` has to work on machines without a driver
#    (driver entry points are looked up at run time instead).

execute_process(COMMAND "${READELF}" -d "${MODULE}" OUTPUT_VARIABLE dynamic
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${MODULE} failed (${rc})")
endif()
if(NOT dynamic MATCHES "NEEDED[^\n]*\\[libstdc\\+\\+\\.so\\.6\\]")
  message(FATAL_ERROR
    "${MODULE} does not link libstdc++.so.6 dynamically. The C++ compiler probably links "
    "libstdc++ statically; configure with -DCMAKE_CXX_COMPILER=/usr/bin/g++ (or another "
    "compiler whose libstdc++ is shared).")
endif()
if(dynamic MATCHES "NEEDED[^\n]*\\[libcuda\\.so")
  message(FATAL_ERROR "${MODULE} links libcuda; driver calls must go through "
                      "cudaGetDriverEntryPointByVersion so the import works without a driver.")
endif()
