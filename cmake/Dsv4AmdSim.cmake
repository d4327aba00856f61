# The gfx942 / gfx950 kernel paths run on the CPU (tests/amd_sim): every kernel source compiled as host
# code by clang with the AMD device-pass macros defined and the wave64 model's HIP header first on the
# include path, once per chip; each chip's objects linked into one test program beside the CPU
# implementations they are compared with. Needs a host clang (ext_vector_type); gcc builds the rest.
# A second program per chip is built entirely by clang with AddressSanitizer: no kernel may read or write
# outside its buffers on the AMD paths either (the tests' buffers are exactly the sizes the ops define).
#
# The kernels' objects are partially linked and every symbol but the launchers (dsv4::gpu) made local:
# the inline functions of the shared numerics headers are compiled there with the AMD paths selected, and
# must not stand in for the CPU library's own copies (or the other way round) at the final link.

option(DSV4OPS_AMD_SIM "run the gfx942/gfx950 kernel paths on the CPU (tests/amd_sim; needs a host clang)" ON)
if(NOT DSV4OPS_AMD_SIM)
  return()
endif()
find_program(DSV4OPS_SIM_CLANG NAMES clang++-19 clang++ DOC "host clang for the wave64 model's kernel builds")
if(NOT DSV4OPS_SIM_CLANG)
  message(FATAL_ERROR "tests/amd_sim needs a host clang (clang++-19: tools/setup.sh --dev installs it), or "
                      "-DDSV4OPS_AMD_SIM=OFF to build the other tests without it")
endif()

set(_sim_dir ${CMAKE_BINARY_DIR}/amd_sim)
file(MAKE_DIRECTORY ${_sim_dir})
file(GLOB _sim_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/amd_sim/test_*.cpp)
set(_sim_host_sources ${PROJECT_SOURCE_DIR}/tests/amd_sim/wave_sim.cpp ${_sim_tests})
# -ffp-contract=off: the device compilers fuse no multiply-add the kernels do not ask for (they spell out fmaf
# where they want one), and the CPU kernels are built without contraction too; so neither may this build.
set(_sim_common_flags -std=c++17 -O1 -g0 -ffp-contract=off -Wno-psabi)
set(_asan_flags -fsanitize=address -fno-omit-frame-pointer)

# ${output}: the kernels of `arch` as one object exporting only the launchers; ARGN: extra compile flags.
function(dsv4_amd_sim_kernels output arch variant)
  set(_objects)
  foreach(_src IN LISTS DSV4OPS_KERNEL_SOURCES)
    get_filename_component(_name ${_src} NAME_WE)
    set(_object ${_sim_dir}/${_name}.${arch}${variant}.o)
    add_custom_command(OUTPUT ${_object}
      COMMAND ${DSV4OPS_SIM_CLANG} -x c++ ${_sim_common_flags} -fno-exceptions ${ARGN}
              -D__HIPCC__ -D__HIP_PLATFORM_AMD__ -D__AMDGCN__ -D__HIP_DEVICE_COMPILE__ -D__${arch}__
              -I${PROJECT_SOURCE_DIR}/tests/amd_sim/include -I${PROJECT_SOURCE_DIR}/src/hip/include
              -I${PROJECT_SOURCE_DIR}/src/hip -MD -MF ${_object}.d -c ${_src} -o ${_object}
      DEPENDS ${_src} DEPFILE ${_object}.d VERBATIM
      COMMENT "wave64 model: ${_name} for ${arch}${variant}")
    list(APPEND _objects ${_object})
  endforeach()
  add_custom_command(OUTPUT ${output}
    COMMAND ${CMAKE_LINKER} -r -o ${output}.partial ${_objects}
    COMMAND ${CMAKE_OBJCOPY} -w "--keep-global-symbol=_ZN4dsv43gpu*" ${output}.partial ${output}
    DEPENDS ${_objects} VERBATIM
    COMMENT "wave64 model: the ${arch}${variant} kernels, launchers exported")
endfunction()

find_library(DSV4OPS_GTEST_LIBRARY gtest REQUIRED)
find_library(DSV4OPS_GTEST_MAIN_LIBRARY gtest_main REQUIRED)
set(_asan_programs)
foreach(_arch gfx942 gfx950)
  set(_kernels ${_sim_dir}/kernels.${_arch}.o)
  dsv4_amd_sim_kernels(${_kernels} ${_arch} "")
  set_source_files_properties(${_kernels} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  set(_target dsv4_amd_sim_${_arch}_test)
  add_executable(${_target} ${_sim_host_sources} ${_kernels})
  target_include_directories(${_target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/amd_sim ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${_target} PRIVATE DSV4_SIM_ARCH="${_arch}")
  target_compile_options(${_target} PRIVATE -ffp-contract=off)
  target_link_libraries(${_target} PRIVATE dsv4_cpu GTest::gtest_main)
  gtest_discover_tests(${_target} TEST_PREFIX "amd_sim_${_arch}." DISCOVERY_TIMEOUT 60)

  # The AddressSanitizer program: the same tests, every object (the CPU kernels included) built by clang.
  set(_asan_kernels ${_sim_dir}/kernels.${_arch}.asan.o)
  dsv4_amd_sim_kernels(${_asan_kernels} ${_arch} ".asan" ${_asan_flags})
  set(_asan_objects)
  foreach(_src IN LISTS DSV4OPS_CPU_SOURCES _sim_host_sources)
    get_filename_component(_name ${_src} NAME_WE)
    set(_object ${_sim_dir}/host_${_name}.${_arch}.asan.o)
    add_custom_command(OUTPUT ${_object}
      COMMAND ${DSV4OPS_SIM_CLANG} ${_sim_common_flags} ${_asan_flags} -DDSV4_SIM_ARCH="${_arch}"
              -I${PROJECT_SOURCE_DIR}/tests/amd_sim -I${PROJECT_SOURCE_DIR}/src/hip/include
              -I${PROJECT_SOURCE_DIR}/src/hip -I${PROJECT_SOURCE_DIR}/src -MD -MF ${_object}.d -c ${_src} -o ${_object}
      DEPENDS ${_src} DEPFILE ${_object}.d VERBATIM
      COMMENT "wave64 model: ${_name} for the ${_arch} AddressSanitizer program")
    list(APPEND _asan_objects ${_object})
  endforeach()
  set(_asan_program ${_sim_dir}/dsv4_amd_sim_${_arch}_asan_test)
  add_custom_command(OUTPUT ${_asan_program}
    COMMAND ${DSV4OPS_SIM_CLANG} ${_asan_flags} ${_asan_objects} ${_asan_kernels} ${DSV4OPS_GTEST_MAIN_LIBRARY}
            ${DSV4OPS_GTEST_LIBRARY} -lpthread -o ${_asan_program}
    DEPENDS ${_asan_objects} ${_asan_kernels} VERBATIM
    COMMENT "wave64 model: the ${_arch} AddressSanitizer program")
  list(APPEND _asan_programs ${_asan_program})
  # The death tests fork a child that aborts on purpose: left to the plain program.
  add_test(NAME amd_sim_${_arch}_asan COMMAND ${_asan_program} --gtest_filter=-*DeathTest*)
  set_tests_properties(amd_sim_${_arch}_asan PROPERTIES
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0:halt_on_error=1")
endforeach()
add_custom_target(amd_sim_asan_programs ALL DEPENDS ${_asan_programs})
