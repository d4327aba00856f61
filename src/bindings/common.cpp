#include "common.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

namespace dsv4::bindings {

std::string dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
    default: return "dtype#" + std::to_string(static_cast<int>(type));
  }
}

ScalarType dtype_of(const Tensor& t) {
  int32_t code = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &code));
  // The shim's dtype codes are c10::ScalarType's values; the 2.10 ABI has no name for this one yet.
  if (code == static_cast<int32_t>(ScalarType::Float8_e8m0fnu)) return ScalarType::Float8_e8m0fnu;
  return t.scalar_type();
}

std::string shape_string(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

std::string device_string(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  return (t.is_cuda() ? std::string("cuda:") : std::string("device:")) + std::to_string(t.get_device_index());
}

void check_dtype(const Tensor& t, const char* op, const char* arg, std::initializer_list<ScalarType> allowed) {
  const ScalarType actual = dtype_of(t);
  std::string expected;
  for (ScalarType type : allowed) {
    if (type == actual) return;
    expected += (expected.empty() ? "" : " or ") + dtype_name(type);
  }
  STD_TORCH_CHECK(false, op, ": ", arg, " must have dtype ", expected, ", got ", dtype_name(actual));
}

void check_contiguous(const Tensor& t, const char* op, const char* arg) {
  STD_TORCH_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous (shape ", shape_string(t),
                  "); call .contiguous() first");
}

Tensor contiguous_aligned(const Tensor& t, int64_t alignment) {
  if (t.is_contiguous() && is_aligned(t.data_ptr(), static_cast<uintptr_t>(alignment))) return t;
  return t.is_contiguous() ? torch::stable::clone(t) : torch::stable::contiguous(t);
}

void check_no_self_overlap(const Tensor& t, const char* op, const char* arg) {
  // A sufficient test: with the dims of more than one element in stride order, each stride reaches past
  // every element the dims before it span.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < span) {
      std::ostringstream strides;
      for (int64_t d = 0; d < t.dim(); ++d) strides << (d ? ", " : "") << t.stride(d);
      STD_TORCH_CHECK(false, op, ": ", arg, " must not overlap itself (an output whose elements share memory, "
                      "such as an expanded view), got shape ", shape_string(t), " with strides [", strides.str(), "]");
    }
    span += stride * (size - 1);
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto span = [](const Tensor& t) {
    int64_t last = 0;  // the last element's offset, in elements
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    return (last + 1) * static_cast<int64_t>(t.element_size());
  };
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const uint8_t*>(a.data_ptr());
  const auto* b0 = static_cast<const uint8_t*>(b.data_ptr());
  return a0 < b0 + span(b) && b0 < a0 + span(a);
}

void check_apart(const Tensor& a, const char* a_arg, const Tensor& b, const char* b_arg, const char* op) {
  STD_TORCH_CHECK(!overlaps(a, b), op, ": ", a_arg, " must not overlap ", b_arg);
}

void check_writes_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> read,
                        const char* op) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    for (auto other = std::next(w); other != written.end(); ++other) {
      check_apart(w->tensor, w->name, other->tensor, other->name, op);
    }
    for (const NamedTensor& r : read) check_apart(r.tensor, r.name, w->tensor, w->name, op);
  }
}

void check_same_device(const Tensor& a, const char* arg_a, const Tensor& b, const char* arg_b, const char* op) {
  const bool same = a.is_cpu() == b.is_cpu() && (a.is_cpu() || a.get_device_index() == b.get_device_index());
  STD_TORCH_CHECK(same, op, ": ", arg_a, " and ", arg_b, " must be on the same device, got ", device_string(a),
                  " and ", device_string(b));
}

Fp8Format checked_fp8_format(int64_t value, const char* op) {
  STD_TORCH_CHECK(value == static_cast<int64_t>(Fp8Format::kOCP) || value == static_cast<int64_t>(Fp8Format::kFNUZ),
                  op, ": fp8_format must be 0 (OCP e4m3fn) or 1 (FNUZ e4m3fnuz), got ", value);
  return static_cast<Fp8Format>(value);
}

ScalarType fp8_dtype(Fp8Format format) {
  return format == Fp8Format::kFNUZ ? ScalarType::Float8_e4m3fnuz : ScalarType::Float8_e4m3fn;
}

float checked_quant_max(double quant_max, Fp8Format format, const char* op) {
  const float max_finite = format == Fp8Format::kFNUZ ? Fp8Traits<Fp8Format::kFNUZ>::kMaxFinite
                                                      : Fp8Traits<Fp8Format::kOCP>::kMaxFinite;
  // The kernels take it as fp32: a positive double that rounds to fp32 zero is refused too.
  STD_TORCH_CHECK(std::isfinite(quant_max) && static_cast<float>(quant_max) > 0 && quant_max <= max_finite, op,
                  ": quant_max must be in (0, ", max_finite, "] for this encoding (and positive in fp32), got ",
                  quant_max);
  return static_cast<float>(quant_max);
}

void check_gpu_grid_rows(const Tensor& on, int64_t rows, int64_t rows_per_block, int64_t threads, const char* op,
                         const char* what) {
  if (on.is_cpu()) return;
  const int64_t max_blocks = std::min<int64_t>(std::numeric_limits<uint32_t>::max() / threads,
                                               std::numeric_limits<int32_t>::max());
  const int64_t max_rows = max_blocks * rows_per_block;
  STD_TORCH_CHECK(rows <= max_rows, op, ": at most ", max_rows, " ", what, " on a GPU (one grid), got ", rows);
}

void check_launch(LaunchStatus status, const char* op) {
  STD_TORCH_CHECK(status == LaunchStatus::kOk, op, ": kernel launch failed (",
                  status == LaunchStatus::kInvalidArgument ? "invalid argument" : "runtime error", ")");
}

}  // namespace dsv4::bindings
