// dsv4ops._C: build facts only (ops are registered through the stable ABI in the other files of this
// folder, which live in the same shared object). No torch headers here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace {

std::vector<std::string> split_archs(const std::string& list) {
  std::vector<std::string> archs;
  std::string current;
  for (char c : list + ";") {
    if (c == ';' || c == ',') {
      if (!current.empty()) archs.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  return archs;
}

// What each compiled target stores natively and which encodings its kernels convert with an instruction
// (dsv4/fp8.h); every other encoding is converted in software on that target.
py::dict fp8_encodings(const std::string& arch) {
  py::dict facts;
  std::vector<std::string> hardware;
  std::string native = "ocp";
  if (arch == "gfx942") {
    native = "fnuz";
    hardware = {"fnuz"};
  } else if (arch == "gfx950" || arch.rfind("sm_9", 0) == 0 || arch.rfind("sm_1", 0) == 0 ||
             arch == "sm_89") {
    hardware = {"ocp"};
  }
#if defined(DSV4_FP8_SOFTWARE_ONLY)
  hardware.clear();
#endif
  facts["native"] = native;
  facts["supported"] = std::vector<std::string>{"ocp", "fnuz"};
  facts["hardware_encode"] = hardware;
  return facts;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dsv4ops build facts";
  m.def("build_info", []() {
    py::dict info;
    info["version"] = DSV4OPS_VERSION;
    info["backend"] = DSV4OPS_BACKEND;
    std::vector<std::string> archs;
    for (const auto& arch : split_archs(DSV4OPS_GPU_ARCHS)) {
      archs.push_back(std::string(DSV4OPS_BACKEND) == "cuda" ? "sm_" + arch : arch);
    }
    info["gpu_archs"] = archs;
    py::dict encodings;
    encodings["cpu"] = fp8_encodings("cpu");
    for (const auto& arch : archs) encodings[py::str(arch)] = fp8_encodings(arch);
    info["fp8_encodings"] = encodings;
    info["torch_built_with"] = DSV4OPS_TORCH_VERSION;
    info["torch_stable_abi_target"] = "2.10";
    info["gpu_compiler"] = DSV4OPS_GPU_COMPILER;
    info["cxx_compiler"] = DSV4OPS_CXX_COMPILER;
    return info;
  });
}
