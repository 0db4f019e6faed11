# One OpenMP runtime in the process: libtorch's own libgomp, which libtorch's RUNPATH loads first
# anyway. Naming that file before find_package(OpenMP) keeps GCC's copy of the same library off the
# link line, and spares CMake a runtime-path conflict between the two. Included by the build
# (CMakeLists.txt) and by the installed package (gradaccumConfig.cmake), after find_package(Torch).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1"
   AND NOT OpenMP_gomp_LIBRARY)
  set(OpenMP_gomp_LIBRARY "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1" CACHE FILEPATH "libtorch's libgomp")
endif()
