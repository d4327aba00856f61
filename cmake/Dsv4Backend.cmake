# Backend and GPU-arch selection. DSV4OPS_BACKEND = cpu | cuda | rocm; DSV4OPS_GPU_ARCHS = a ';' or ','
# separated list, validated against the archs the kernels are written for. Both come from the cache or,
# when unset there, from the environment (so `DSV4OPS_BACKEND=cuda pip install ...` works).

set(DSV4OPS_ALLOWED_BACKENDS cpu cuda rocm)
set(DSV4OPS_ALLOWED_ARCHS_cuda 90a 90 89 100a)
set(DSV4OPS_ALLOWED_ARCHS_rocm gfx942 gfx950)
set(DSV4OPS_DEFAULT_ARCHS_cuda 90a)
set(DSV4OPS_DEFAULT_ARCHS_rocm gfx942 gfx950)

if(NOT DEFINED DSV4OPS_BACKEND)
  set(_backend "$ENV{DSV4OPS_BACKEND}")
  if(_backend STREQUAL "")
    set(_backend cpu)
  endif()
  set(DSV4OPS_BACKEND "${_backend}" CACHE STRING "dsv4ops backend: cpu, cuda or rocm")
endif()
if(NOT DSV4OPS_BACKEND IN_LIST DSV4OPS_ALLOWED_BACKENDS)
  message(FATAL_ERROR "DSV4OPS_BACKEND='${DSV4OPS_BACKEND}' is not one of: ${DSV4OPS_ALLOWED_BACKENDS}")
endif()

if(NOT DEFINED DSV4OPS_GPU_ARCHS)
  set(DSV4OPS_GPU_ARCHS "$ENV{DSV4OPS_GPU_ARCHS}" CACHE STRING "GPU archs to compile (cuda: 90a; rocm: gfx942;gfx950)")
endif()
string(REPLACE "," ";" _archs "${DSV4OPS_GPU_ARCHS}")
string(STRIP "${_archs}" _archs)

if(DSV4OPS_BACKEND STREQUAL "cpu")
  if(NOT _archs STREQUAL "")
    message(FATAL_ERROR "DSV4OPS_GPU_ARCHS='${DSV4OPS_GPU_ARCHS}' was given but DSV4OPS_BACKEND is cpu; "
                        "set DSV4OPS_BACKEND=cuda or rocm, or unset DSV4OPS_GPU_ARCHS")
  endif()
  set(DSV4OPS_ARCH_LIST "")
else()
  if(_archs STREQUAL "")
    set(_archs ${DSV4OPS_DEFAULT_ARCHS_${DSV4OPS_BACKEND}})
  endif()
  foreach(_arch IN LISTS _archs)
    if(NOT _arch IN_LIST DSV4OPS_ALLOWED_ARCHS_${DSV4OPS_BACKEND})
      message(FATAL_ERROR "DSV4OPS_GPU_ARCHS: '${_arch}' is not a known ${DSV4OPS_BACKEND} arch; "
                          "allowed: ${DSV4OPS_ALLOWED_ARCHS_${DSV4OPS_BACKEND}}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _archs)
  set(DSV4OPS_ARCH_LIST ${_archs})
endif()

if(DSV4OPS_BACKEND STREQUAL "cuda")
  enable_language(CUDA)
  set(DSV4OPS_GPU_COMPILER_ID "nvcc ${CMAKE_CUDA_COMPILER_VERSION}")
elseif(DSV4OPS_BACKEND STREQUAL "rocm")
  # Needs CMake >= 3.31 with a ROCm clang (or the clang 20 wrapper of tools/setup_amdgpu_toolchain.sh).
  enable_language(HIP)
  set(DSV4OPS_GPU_COMPILER_ID "hip-clang ${CMAKE_HIP_COMPILER_VERSION}")
else()
  set(DSV4OPS_GPU_COMPILER_ID "none")
endif()
message(STATUS "dsv4ops: backend=${DSV4OPS_BACKEND} archs='${DSV4OPS_ARCH_LIST}'")
