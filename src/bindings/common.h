// Shared helpers of the torch-facing layer: input checks with messages that name the argument, the
// expected and the actual value, and the CPU/GPU launch split. Only src/bindings includes torch.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "dsv4/fp8.h"
#include "dsv4/platform.h"

namespace dsv4::bindings {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

std::string dtype_name(ScalarType type);
// t.scalar_type(), except that float8_e8m0fnu (which the 2.10 stable ABI cannot name) is recognized too.
ScalarType dtype_of(const Tensor& t);
std::string shape_string(const Tensor& t);
std::string device_string(const Tensor& t);

void check_dtype(const Tensor& t, const char* op, const char* arg, std::initializer_list<ScalarType> allowed);
void check_contiguous(const Tensor& t, const char* op, const char* arg);
// `t` itself where it is contiguous and its data starts `alignment`-byte aligned, else a contiguous copy (a fresh
// allocation, aligned): for a kernel that reads an input densely, several bytes at a time. Call it after the
// input's checks, so that a refused view (say a huge expanded one) is never copied.
Tensor contiguous_aligned(const Tensor& t, int64_t alignment);
// Refuses a strided output whose elements share memory (an expanded view, say): the kernels' threads would
// race on them and the result would depend on scheduling.
void check_no_self_overlap(const Tensor& t, const char* op, const char* arg);
// Whether the byte ranges the two tensors span (first to last element, whatever their strides) meet.
bool overlaps(const Tensor& a, const Tensor& b);
// Refuses two tensors whose byte ranges (first to last element, whatever their strides) meet, where the op
// writes at least one of them: the kernels read inputs while other threads write outputs, so the result
// would depend on scheduling.
void check_apart(const Tensor& a, const char* a_arg, const Tensor& b, const char* b_arg, const char* op);
struct NamedTensor {
  const Tensor& tensor;
  const char* name;
};
// check_apart for every pair of written tensors and every (read, written) pair.
void check_writes_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> read,
                        const char* op);
void check_same_device(const Tensor& a, const char* arg_a, const Tensor& b, const char* arg_b, const char* op);
Fp8Format checked_fp8_format(int64_t value, const char* op);
ScalarType fp8_dtype(Fp8Format format);
// quant_max validated against the encoding: finite, in (0, largest finite value].
float checked_quant_max(double quant_max, Fp8Format format, const char* op);

// The GPU launch expression of a binding; a CPU-only build compiles none of it (and never reaches it:
// only the CPU dispatch key is registered there).
#if defined(DSV4OPS_WITH_GPU)
#define DSV4_GPU_LAUNCH(...) __VA_ARGS__
#else
#define DSV4_GPU_LAUNCH(...) ::dsv4::LaunchStatus::kInvalidArgument
#endif

// Elements per CPU task: small tensors stay on one thread.
inline constexpr int64_t kCpuGrain = 1 << 15;

void check_launch(LaunchStatus status, const char* op);

// The rows a GPU kernel whose grid runs one block of `threads` threads per `rows_per_block` rows along x
// serves: ROCm refuses a launch of more than 2^32 - 1 threads along x (CUDA, more than 2^31 - 1 blocks), so
// larger calls are refused here with a message, not left to a failed or wrapped launch. A CPU tensor passes.
void check_gpu_grid_rows(const Tensor& on, int64_t rows, int64_t rows_per_block, int64_t threads, const char* op,
                         const char* what);

// Runs cpu(begin, end) over [0, n) on the CPU threads, or gpu(stream) on the current stream of the
// device that `on` lives on. Nothing runs when n == 0.
// cpu_grain: the fewest items per CPU task (items may be rows rather than elements).
template <class CpuFn, class GpuFn>
void run_on_device(const Tensor& on, int64_t n, const char* op, CpuFn&& cpu, GpuFn&& gpu,
                   int64_t cpu_grain = kCpuGrain) {
  if (n == 0) return;
  if (on.is_cpu()) {
    torch::stable::parallel_for(0, n, cpu_grain, [&](int64_t begin, int64_t end) { cpu(begin, end); });
    return;
  }
#if defined(DSV4OPS_WITH_GPU)
  const int32_t device = on.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  check_launch(gpu(stream), op);
#else
  (void)gpu;
  STD_TORCH_CHECK(false, op, ": this dsv4ops build has no GPU backend; got a tensor on ", device_string(on));
#endif
}

}  // namespace dsv4::bindings
