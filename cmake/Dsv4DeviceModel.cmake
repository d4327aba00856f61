# The kernels' device paths run on the CPU (tests/device_model): kernel sources compiled as host code by clang
# with a device pass's macros defined and the model's device header first on the include path -- the gfx942
# and the gfx950 paths on the wave64 model, the NVIDIA sm_90a paths on the 32-lane one -- each chip's objects
# linked into one test program beside the CPU implementations they are compared with. Needs a host clang
# (ext_vector_type); gcc builds the rest.
#
# A second program per chip is built entirely by clang with AddressSanitizer: no kernel may read or write
# outside its buffers on the device paths either (the tests' buffers are exactly the sizes the ops define).
# Each program runs twice: in slot order, and with the threads of a pass in reverse order (wave_sim.h) and, on
# sm_90a, the other phase of the model's held-back launches, so that every pair of consecutive launches has its
# dependent run its part before griddepcontrol.wait first.
#
# The kernels' objects are partially linked and every symbol but the launchers (dsv4::gpu) made local:
# the inline functions of the shared numerics headers are compiled there with a device path selected, and
# must not stand in for the CPU library's own copies (or the other way round) at the final link.
#

option(DSV4OPS_DEVICE_MODEL "run the kernels' device paths on the CPU (tests/device_model; needs a host clang)" ON)
if(NOT DSV4OPS_DEVICE_MODEL)
  return()
endif()
find_program(DSV4OPS_MODEL_CLANG NAMES clang++-19 clang++ DOC "host clang for the device model's kernel builds")
if(NOT DSV4OPS_MODEL_CLANG)
  message(FATAL_ERROR "tests/device_model needs a host clang (clang++-19: tools/setup.sh --dev installs it), or "
                      "-DDSV4OPS_DEVICE_MODEL=OFF to build the other tests without it")
endif()

set(_model_dir ${CMAKE_BINARY_DIR}/device_model)
set(_model_src ${PROJECT_SOURCE_DIR}/tests/device_model)
file(MAKE_DIRECTORY ${_model_dir})
# -ffp-contract=off: the device compilers fuse no multiply-add the kernels do not ask for (they spell out fmaf
# where they want one), and the CPU kernels are built without contraction too; so neither may this build.
set(_model_common_flags -std=c++17 -O1 -g0 -ffp-contract=off -Wno-psabi)
set(_asan_flags -fsanitize=address -fno-omit-frame-pointer)

# Per chip: the device pass's macros, the shim folder, the lanes of a wave, the instruction set, the kernels
# and the tests.
set(_chip_gfx942_macros -D__HIPCC__ -D__HIP_PLATFORM_AMD__ -D__AMDGCN__ -D__HIP_DEVICE_COMPILE__ -D__gfx942__)
set(_chip_gfx950_macros -D__HIPCC__ -D__HIP_PLATFORM_AMD__ -D__AMDGCN__ -D__HIP_DEVICE_COMPILE__ -D__gfx950__)
set(_chip_sm90a_macros -D__CUDACC__ -D__CUDA_ARCH__=900 -D__CUDA_ARCH_FEAT_SM90_ALL -DDSV4_CUDA_SM90A_ONLY_BUILD=1)
set(_chip_gfx942_include ${_model_src}/include_cdna)
set(_chip_gfx950_include ${_model_src}/include_cdna)
set(_chip_sm90a_include ${_model_src}/include_sm90)
set(_chip_gfx942_wave 64)
set(_chip_gfx950_wave 64)
set(_chip_sm90a_wave 32)
set(_cdna_tests cdna_model sim_bmm sim_indexer_logits sim_indexer_topk sim_kv_cache_fp8 sim_mhc sim_sparse_mla
                sim_wo_a_quant)
set(_chip_gfx942_tests ${_cdna_tests})
set(_chip_gfx950_tests ${_cdna_tests})
set(_chip_sm90a_tests ${_cdna_tests})
list(TRANSFORM _chip_sm90a_tests REPLACE "^cdna_model$" "sm90_model")
set(_chip_gfx942_kernels ${DSV4OPS_KERNEL_SOURCES})
set(_chip_gfx950_kernels ${DSV4OPS_KERNEL_SOURCES})
set(_chip_sm90a_kernels ${DSV4OPS_KERNEL_SOURCES})

# ${output}: the kernels of `chip` as one object exporting only the launchers; ARGN: extra compile flags.
function(dsv4_model_kernels output chip variant)
  set(_objects)
  foreach(_src IN LISTS _chip_${chip}_kernels)
    get_filename_component(_name ${_src} NAME_WE)
    set(_object ${_model_dir}/${_name}.${chip}${variant}.o)
    add_custom_command(OUTPUT ${_object}
      COMMAND ${DSV4OPS_MODEL_CLANG} -x c++ ${_model_common_flags} -fno-exceptions ${ARGN} ${_chip_${chip}_macros}
              -DDSV4_SIM_WAVE_SIZE=${_chip_${chip}_wave} -I${_chip_${chip}_include}
              -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip -MD -MF ${_object}.d
              -c ${_src} -o ${_object}
      DEPENDS ${_src} DEPFILE ${_object}.d VERBATIM
      COMMENT "device model: ${_name} for ${chip}${variant}")
    list(APPEND _objects ${_object})
  endforeach()
  add_custom_command(OUTPUT ${output}
    COMMAND ${CMAKE_LINKER} -r -o ${output}.partial ${_objects}
    COMMAND ${CMAKE_OBJCOPY} -w "--keep-global-symbol=_ZN4dsv43gpu*" ${output}.partial ${output}
    DEPENDS ${_objects} VERBATIM
    COMMENT "device model: the ${chip}${variant} kernels, launchers exported")
endfunction()

find_library(DSV4OPS_GTEST_LIBRARY gtest REQUIRED)
find_library(DSV4OPS_GTEST_MAIN_LIBRARY gtest_main REQUIRED)
set(_asan_programs)
foreach(_chip gfx942 gfx950 sm90a)
  if(_chip STREQUAL "sm90a")
    set(_instructions ${_model_src}/nvidia_instructions.cpp)
    set(_arch_name sm_90a)
  else()
    set(_instructions ${_model_src}/cdna_instructions.cpp)
    set(_arch_name ${_chip})
  endif()
  set(_host_sources ${_model_src}/wave_sim.cpp ${_instructions})
  foreach(_test IN LISTS _chip_${_chip}_tests)
    list(APPEND _host_sources ${_model_src}/test_${_test}.cpp)
  endforeach()
  set(_host_definitions DSV4_SIM_ARCH="${_arch_name}" DSV4_SIM_WAVE_SIZE=${_chip_${_chip}_wave})

  set(_kernels ${_model_dir}/kernels.${_chip}.o)
  dsv4_model_kernels(${_kernels} ${_chip} "")
  set_source_files_properties(${_kernels} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  set(_target dsv4_model_${_chip}_test)
  add_executable(${_target} ${_host_sources} ${_kernels})
  target_include_directories(${_target} PRIVATE ${_model_src} ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${_target} PRIVATE ${_host_definitions})
  target_compile_options(${_target} PRIVATE -ffp-contract=off)
  target_link_libraries(${_target} PRIVATE dsv4_cpu GTest::gtest_main)
  gtest_discover_tests(${_target} TEST_PREFIX "model_${_chip}." DISCOVERY_TIMEOUT 60)
  # The whole program once more in the other orders: threads last first (a missing barrier or warp sync shows
  # in one of the two orders) and, on sm_90a, the other launches held back.
  add_test(NAME model_${_chip}_other_order COMMAND ${_target} --gtest_filter=-*DeathTest*)
  set_tests_properties(model_${_chip}_other_order PROPERTIES ENVIRONMENT "DSV4_MODEL_REVERSE=1;DSV4_MODEL_PDL_PHASE=1")

  # The AddressSanitizer program: the same tests, every object (the CPU kernels included) built by clang.
  set(_asan_kernels ${_model_dir}/kernels.${_chip}.asan.o)
  dsv4_model_kernels(${_asan_kernels} ${_chip} ".asan" ${_asan_flags})
  set(_asan_objects)
  set(_asan_definitions)
  foreach(_definition IN LISTS _host_definitions)
    list(APPEND _asan_definitions -D${_definition})
  endforeach()
  foreach(_src IN LISTS DSV4OPS_CPU_SOURCES _host_sources)
    get_filename_component(_name ${_src} NAME_WE)
    set(_object ${_model_dir}/host_${_name}.${_chip}.asan.o)
    add_custom_command(OUTPUT ${_object}
      COMMAND ${DSV4OPS_MODEL_CLANG} ${_model_common_flags} ${_asan_flags} ${_asan_definitions}
              -I${_model_src} -I${PROJECT_SOURCE_DIR}/src/hip/include -I${PROJECT_SOURCE_DIR}/src/hip
              -I${PROJECT_SOURCE_DIR}/src -MD -MF ${_object}.d -c ${_src} -o ${_object}
      DEPENDS ${_src} DEPFILE ${_object}.d VERBATIM
      COMMENT "device model: ${_name} for the ${_chip} AddressSanitizer program")
    list(APPEND _asan_objects ${_object})
  endforeach()
  set(_asan_program ${_model_dir}/dsv4_model_${_chip}_asan_test)
  add_custom_command(OUTPUT ${_asan_program}
    COMMAND ${DSV4OPS_MODEL_CLANG} ${_asan_flags} ${_asan_objects} ${_asan_kernels} ${DSV4OPS_GTEST_MAIN_LIBRARY}
            ${DSV4OPS_GTEST_LIBRARY} -lpthread -o ${_asan_program}
    DEPENDS ${_asan_objects} ${_asan_kernels} VERBATIM
    COMMENT "device model: the ${_chip} AddressSanitizer program")
  list(APPEND _asan_programs ${_asan_program})
  # The death tests fork a child that aborts on purpose: left to the plain program; so, on AMD, are the
  # sm_90a warpgroup kernels' shapes, which there repeat the smaller ones' paths at several times their cost.
  set(_asan_filter -*DeathTest*)
  if(NOT _chip STREQUAL "sm90a")
    string(APPEND _asan_filter ":*WarpgroupKernelShapes")
  endif()
  add_test(NAME model_${_chip}_asan COMMAND ${_asan_program} --gtest_filter=${_asan_filter})
  set_tests_properties(model_${_chip}_asan PROPERTIES
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0:halt_on_error=1")
endforeach()
add_custom_target(device_model_asan_programs ALL DEPENDS ${_asan_programs})
