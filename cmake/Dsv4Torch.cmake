# Torch for the stable-ABI bindings: headers and the libraries that export the C shims (libtorch_cpu,
# plus libtorch_cuda or libtorch_hip for GPU builds). Taken from the torch installed in the Python that
# runs the build; nothing is downloaded. find_package(Torch) is not needed for stable-ABI code.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_status)
if(NOT _torch_status EQUAL 0)
  message(FATAL_ERROR "dsv4ops: cannot import torch from ${Python_EXECUTABLE}. Install torch first and build "
                      "without build isolation (pip install --no-build-isolation .)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 DSV4OPS_TORCH_DIR)
list(GET _torch_info 1 DSV4OPS_TORCH_VERSION)
message(STATUS "dsv4ops: torch ${DSV4OPS_TORCH_VERSION} at ${DSV4OPS_TORCH_DIR}")

function(dsv4ops_compile_against_stable_torch target)
  # Target 2.10: one build loads in every torch from 2.10 on; unstable torch headers become #errors.
  target_compile_definitions(${target} PRIVATE TORCH_STABLE_ONLY TORCH_TARGET_VERSION=0x020a000000000000)
  target_include_directories(${target} SYSTEM PRIVATE ${DSV4OPS_TORCH_DIR}/include)
endfunction()

function(dsv4ops_link_stable_torch target)
  # The stable C shims live in libtorch_cpu (and libtorch_cuda / libtorch_hip for the GPU stream).
  target_link_libraries(${target} PRIVATE ${DSV4OPS_TORCH_DIR}/lib/libtorch_cpu.so)
  if(DSV4OPS_BACKEND STREQUAL "cuda")
    target_link_libraries(${target} PRIVATE ${DSV4OPS_TORCH_DIR}/lib/libtorch_cuda.so)
  elseif(DSV4OPS_BACKEND STREQUAL "rocm")
    target_link_libraries(${target} PRIVATE ${DSV4OPS_TORCH_DIR}/lib/libtorch_hip.so)
  endif()
endfunction()
