# The gfx942 / gfx950 kernel paths run on the CPU (tests/amd_sim): every kernel source compiled as host
# code by clang with the AMD device-pass macros defined and the wave64 model's HIP header first on the
# include path, once per chip; each chip's objects linked into one test program beside the CPU
# implementations they are compared with. Needs a host clang (ext_vector_type); gcc builds the rest.
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

foreach(_arch gfx942 gfx950)
  set(_objects)
  foreach(_src IN LISTS DSV4OPS_KERNEL_SOURCES)
    get_filename_component(_name ${_src} NAME_WE)
    set(_object ${_sim_dir}/${_name}.${_arch}.o)
    # -ffp-contract=off: the device compilers fuse no multiply-add the kernels do not ask for (they spell
    # out fmaf where they want one), so neither may the host build.
    add_custom_command(OUTPUT ${_object}
      COMMAND ${DSV4OPS_SIM_CLANG} -x c++ -std=c++17 -O1 -g0 -fno-exceptions -ffp-contract=off -Wno-psabi
              -D__HIPCC__ -D__HIP_PLATFORM_AMD__ -D__AMDGCN__ -D__HIP_DEVICE_COMPILE__ -D__${_arch}__
              -I${PROJECT_SOURCE_DIR}/tests/amd_sim/include -I${PROJECT_SOURCE_DIR}/src/hip/include
              -I${PROJECT_SOURCE_DIR}/src/hip -MD -MF ${_object}.d -c ${_src} -o ${_object}
      DEPENDS ${_src} DEPFILE ${_object}.d VERBATIM
      COMMENT "wave64 model: ${_name} for ${_arch}")
    list(APPEND _objects ${_object})
  endforeach()
  set(_kernels ${_sim_dir}/kernels.${_arch}.o)
  add_custom_command(OUTPUT ${_kernels}
    COMMAND ${CMAKE_LINKER} -r -o ${_kernels}.partial ${_objects}
    COMMAND ${CMAKE_OBJCOPY} -w "--keep-global-symbol=_ZN4dsv43gpu*" ${_kernels}.partial ${_kernels}
    DEPENDS ${_objects} VERBATIM
    COMMENT "wave64 model: the ${_arch} kernels, launchers exported")
  set_source_files_properties(${_kernels} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)

  set(_target dsv4_amd_sim_${_arch}_test)
  add_executable(${_target} ${PROJECT_SOURCE_DIR}/tests/amd_sim/wave_sim.cpp ${_sim_tests} ${_kernels})
  target_include_directories(${_target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/amd_sim ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${_target} PRIVATE DSV4_SIM_ARCH="${_arch}")
  target_compile_options(${_target} PRIVATE -ffp-contract=off)
  target_link_libraries(${_target} PRIVATE dsv4_cpu GTest::gtest_main)
  gtest_discover_tests(${_target} TEST_PREFIX "amd_sim_${_arch}." DISCOVERY_TIMEOUT 60)
endforeach()
