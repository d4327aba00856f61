# Device-code check without a GPU: compiles every kernel source to assembly for gfx942 and gfx950
# (clang HIP, device pass only), to PTX plus an object for sm_90a (nvcc, host pass included, as the
# sm_90a wheel compiles it: a device pass alone misses what only the host pass parses) and to an object for
# the other NVIDIA archs the CUDA build accepts, then registers CTest checks that the FP8 conversion
# instructions are present and that no kernel uses scratch memory or spills.
# Toolchain: spec/toolchain.md; tools/setup_amdgpu_toolchain.sh builds the clang wrapper and device libs.

set(DSV4OPS_HIP_CLANG "${PROJECT_SOURCE_DIR}/.toolchain/clang20/bin/clang++" CACHE FILEPATH
    "HIP clang for the gfx942/gfx950 device check (needs LLVM >= 20 for gfx950)")
set(DSV4OPS_HIP_DEVICE_LIBS "${PROJECT_SOURCE_DIR}/.toolchain/devlibs" CACHE PATH
    "ROCm device bitcode folder holding oclc_isa_version_942/950")
find_program(DSV4OPS_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
find_package(Python REQUIRED COMPONENTS Interpreter)

# An object of `source` compiled by nvcc with the gencode options that follow (ARGN), for a compile-only check.
function(dsv4_nvcc_object output source comment)
  add_custom_command(OUTPUT ${output}
    COMMAND ${DSV4OPS_NVCC} -x cu -std=c++17 -O3 ${ARGN} -I${PROJECT_SOURCE_DIR}/src/hip/include
            -I${PROJECT_SOURCE_DIR}/src/hip -MD -MF ${output}.d -c ${source} -o ${output}
    DEPENDS ${source} DEPFILE ${output}.d VERBATIM
    COMMENT "${comment}")
endfunction()

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
            -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip -MD -MF ${_ptx}.d -ptx ${_src}
            -o ${_ptx}
    COMMAND ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/check_device_code.py run-to-log ${_ptxas_log} --
            ${DSV4OPS_NVCC} -x cu -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Xptxas -v
            -DDSV4_CUDA_SM90A_ONLY_BUILD=1 -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip
            -c ${_src} -o ${_check_dir}/${_name}.sm_90a.o
    DEPENDS ${_src} DEPFILE ${_ptx}.d VERBATIM
    COMMENT "device check: ${_name} for sm_90a")
  list(APPEND _outputs ${_ptx} ${_ptxas_log})
  # The other NVIDIA archs the README lists for the CUDA build (sm_90, sm_89, sm_100a): compiled only,
  # so that a source that builds for sm_90a alone is caught (their wgmma-free passes take other paths).
  set(_other_nvidia ${_check_dir}/${_name}.other_nvidia.o)
  dsv4_nvcc_object(${_other_nvidia} ${_src} "device check: ${_name} for sm_90, sm_89, sm_100a"
                   -gencode arch=compute_90,code=sm_90 -gencode arch=compute_89,code=sm_89
                   -gencode arch=compute_100a,code=sm_100a)
  list(APPEND _outputs ${_other_nvidia})
endforeach()
# The kernel-pattern ceilings under bench/micro (standalone sm_90a programs): compiled to objects, so that they
# keep building as the device helpers they include change.
foreach(_micro IN ITEMS ${PROJECT_SOURCE_DIR}/bench/micro/indexer_wgmma_rate.cu)
  get_filename_component(_name ${_micro} NAME_WE)
  set(_micro_object ${_check_dir}/micro_${_name}.sm_90a.o)
  dsv4_nvcc_object(${_micro_object} ${_micro} "device check: bench/micro/${_name} for sm_90a"
                   -gencode arch=compute_90a,code=sm_90a)
  list(APPEND _outputs ${_micro_object})
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

# The kernels that must run on the matrix units: the MFMA instruction in each AMD code object (gfx950 has
# its own where a kernel has a form for them: the wo_a GEMM's block-scaled MFMA, the unit applying the UE8M0
# block scales that gfx942 folds in software; the double-rate FP8 MFMA of the indexer's 128-dim logits; the
# double-rate bf16 MFMA of the sparse MLA decode and of the mHC dot products) and the MMA instruction in the
# PTX of `source` (a kernel file's name without extension).
function(dsv4_expect_matrix_units test_name source gfx942_instruction gfx950_instruction ptx_instruction)
  add_test(NAME device_gfx942_${test_name}
           COMMAND ${_checker} expect-instruction ${gfx942_instruction} ${_check_dir}/${source}.gfx942.s)
  add_test(NAME device_gfx950_${test_name}
           COMMAND ${_checker} expect-instruction ${gfx950_instruction} ${_check_dir}/${source}.gfx950.s)
  add_test(NAME device_sm_90a_${test_name}
           COMMAND ${_checker} expect-instruction ${ptx_instruction} ${_check_dir}/${source}.sm_90a.ptx)
endfunction()
set(_fp8_mma mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32)
set(_bf16_mma mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32)
dsv4_expect_matrix_units(wo_a_bmm_matrix_units bmm_a8w8_mxscale v_mfma_f32_16x16x32_fp8_fp8
                         v_mfma_scale_f32_16x16x128_f8f6f4 ${_fp8_mma})
dsv4_expect_matrix_units(indexer_logits_matrix_units indexer_logits v_mfma_f32_16x16x32_fp8_fp8
                         v_mfma_f32_16x16x128_f8f6f4 ${_fp8_mma})
dsv4_expect_matrix_units(sparse_mla_matrix_units sparse_mla_decode v_mfma_f32_16x16x16_bf16
                         v_mfma_f32_16x16x32_bf16 ${_bf16_mma})
dsv4_expect_matrix_units(mhc_matrix_units mhc v_mfma_f32_16x16x16_bf16 v_mfma_f32_16x16x32_bf16 ${_bf16_mma})
# Every block-scaled MFMA takes its scale bytes from VGPRs (the unit misreads an SGPR or a constant).
add_test(NAME device_gfx950_block_scale_operands_in_vgprs
         COMMAND ${_checker} amd-scale-operands-in-vgprs ${_check_dir}/bmm_a8w8_mxscale.gfx950.s)
# The indexer asks for the unscaled f8f6f4 MFMA through the scaled builtin with immediate zero scales, which
# the compiler turns into the unscaled instruction; a compiler that kept the scaled one would multiply every
# logit by 2^-254 (a zero byte is 2^-127), so no scaled MFMA may remain in its code object.
add_test(NAME device_gfx950_indexer_logits_no_scaled_mfma
         COMMAND ${_checker} expect-no-instruction v_mfma_scale_ ${_check_dir}/indexer_logits.gfx950.s)
