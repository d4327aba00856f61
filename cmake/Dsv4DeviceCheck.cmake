# Device-code check without a GPU: compiles every kernel source to assembly for gfx942 and gfx950
# (clang HIP, device pass only) and to PTX + cubin for sm_90a (nvcc), then registers CTest checks that
# the FP8 conversion instructions are present and that no kernel uses scratch memory or spills.
# Toolchain: spec/toolchain.md; tools/setup_amdgpu_toolchain.sh builds the clang wrapper and device libs.

set(DSV4OPS_HIP_CLANG "${PROJECT_SOURCE_DIR}/.toolchain/clang20/bin/clang++" CACHE FILEPATH
    "HIP clang for the gfx942/gfx950 device check (needs LLVM >= 20 for gfx950)")
set(DSV4OPS_HIP_DEVICE_LIBS "${PROJECT_SOURCE_DIR}/.toolchain/devlibs" CACHE PATH
    "ROCm device bitcode folder holding oclc_isa_version_942/950")
find_program(DSV4OPS_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
find_package(Python REQUIRED COMPONENTS Interpreter)

set(_check_dir ${CMAKE_BINARY_DIR}/device_check)
file(MAKE_DIRECTORY ${_check_dir})
set(_outputs)
set(_amd_asm_gfx942)
set(_amd_asm_gfx950)
foreach(_src IN LISTS DSV4OPS_KERNEL_SOURCES)
  get_filename_component(_name ${_src} NAME_WE)
  foreach(_arch gfx942 gfx950)
    set(_asm ${_check_dir}/${_name}.${_arch}.s)
    add_custom_command(OUTPUT ${_asm}
      COMMAND ${DSV4OPS_HIP_CLANG} -x hip -std=c++17 -O3 --offload-arch=${_arch} --offload-device-only
              --no-gpu-bundle-output --rocm-device-lib-path=${DSV4OPS_HIP_DEVICE_LIBS}
              -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip
              -MD -MF ${_asm}.d -S ${_src} -o ${_asm}
      DEPENDS ${_src} DEPFILE ${_asm}.d VERBATIM
      COMMENT "device check: ${_name} for ${_arch}")
    list(APPEND _outputs ${_asm})
    list(APPEND _amd_asm_${_arch} ${_asm})
  endforeach()
  set(_ptx ${_check_dir}/${_name}.sm_90a.ptx)
  set(_ptxas_log ${_check_dir}/${_name}.sm_90a.ptxas.log)
  add_custom_command(OUTPUT ${_ptx} ${_ptxas_log}
    COMMAND ${DSV4OPS_NVCC} -x cu -std=c++17 -O3 -gencode arch=compute_90a,code=compute_90a
            -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip -ptx ${_src} -o ${_ptx}
    COMMAND ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/check_device_code.py run-to-log ${_ptxas_log} --
            ${DSV4OPS_NVCC} -x cu -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Xptxas -v
            -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip -cubin ${_src}
            -o ${_check_dir}/${_name}.sm_90a.cubin
    DEPENDS ${_src} VERBATIM
    COMMENT "device check: ${_name} for sm_90a")
  list(APPEND _outputs ${_ptx} ${_ptxas_log})
endforeach()
add_custom_target(device_check ALL DEPENDS ${_outputs})

set(_checker ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/check_device_code.py)
foreach(_arch gfx942 gfx950)
  add_test(NAME device_${_arch}_fp8_convert_instruction
           COMMAND ${_checker} expect-instruction v_cvt_pk_fp8_f32 ${_check_dir}/fp8_encode.${_arch}.s)
  add_test(NAME device_${_arch}_no_scratch_or_spills COMMAND ${_checker} amd-no-spills ${_amd_asm_${_arch}})
endforeach()
add_test(NAME device_sm_90a_fp8_convert_instruction
         COMMAND ${_checker} expect-instruction cvt.rn.satfinite.e4m3x2.f32 ${_check_dir}/fp8_encode.sm_90a.ptx)
set(_ptxas_logs)
foreach(_src IN LISTS DSV4OPS_KERNEL_SOURCES)
  get_filename_component(_name ${_src} NAME_WE)
  list(APPEND _ptxas_logs ${_check_dir}/${_name}.sm_90a.ptxas.log)
endforeach()
add_test(NAME device_sm_90a_no_spills COMMAND ${_checker} ptxas-no-spills ${_ptxas_logs})

# ---- wo_a (spec/wo_a.md): the grouped FP8 GEMM runs on the matrix units of every target ----
foreach(_arch gfx942 gfx950)
  add_test(NAME device_${_arch}_wo_a_bmm_fp8_mfma
           COMMAND ${_checker} expect-instruction v_mfma_f32_16x16x32_fp8_fp8
                   ${_check_dir}/bmm_a8w8_mxscale.${_arch}.s)
endforeach()
add_test(NAME device_sm_90a_wo_a_bmm_fp8_mma
         COMMAND ${_checker} expect-instruction mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32
                 ${_check_dir}/bmm_a8w8_mxscale.sm_90a.ptx)
# ---- end wo_a ----
# ---- indexer (src/hip/indexer): the logits kernels use the matrix units on every target ----
foreach(_arch gfx942 gfx950)
  add_test(NAME device_${_arch}_indexer_fp8_mfma
           COMMAND ${_checker} expect-instruction v_mfma_f32_16x16x32_fp8_fp8 ${_check_dir}/indexer_logits.${_arch}.s)
endforeach()
add_test(NAME device_sm_90a_indexer_fp8_mma
         COMMAND ${_checker} expect-instruction mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32
                 ${_check_dir}/indexer_logits.sm_90a.ptx)
# ---- end indexer ----
# ---- sparse_mla (issue 7): the split-K decode kernel runs S = Q K^T and P V on the matrix units ----
foreach(_arch gfx942 gfx950)
  add_test(NAME device_${_arch}_sparse_mla_mfma_instruction
           COMMAND ${_checker} expect-instruction v_mfma_f32_16x16x16_bf16
                   ${_check_dir}/sparse_mla_decode.${_arch}.s)
endforeach()
add_test(NAME device_sm_90a_sparse_mla_mma_instruction
         COMMAND ${_checker} expect-instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
                 ${_check_dir}/sparse_mla_decode.sm_90a.ptx)
# ---- end sparse_mla ----
# ---- mhc (spec/mhc.md): the pre dot products run on the matrix units of every target ----
foreach(_arch gfx942 gfx950)
  add_test(NAME device_${_arch}_mhc_bf16_mfma
           COMMAND ${_checker} expect-instruction v_mfma_f32_16x16x16_bf16 ${_check_dir}/mhc.${_arch}.s)
endforeach()
add_test(NAME device_sm_90a_mhc_bf16_mma
         COMMAND ${_checker} expect-instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
                 ${_check_dir}/mhc.sm_90a.ptx)
# ---- end mhc ----
