// Compute ceiling of the indexer decode kernel's tensor-core pattern (src/hip/indexer/indexer_logits.hip), with
// every operand resident in shared memory (no copies, no stores): per 64-key sub-tile one chain of four
// wgmma m64n128k32 e4m3 (A: the keys, B: two rows' q), committed and waited for, alone and followed by the
// ReLU-weighted head sums the kernel applies to the accumulators; also the row path's m64n64k32 chains. Blocks of
// two warp groups, one or two an SM. Prints TFLOP/s (2 x M x N x K a chain; the operand values do not matter to
// the rate).
//
// Build and run on an sm_90a GPU, from the repository root:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc/hip/include -Isrc/hip -Isrc \
//     bench/micro/indexer_wgmma_rate.cu -o /tmp/indexer_wgmma_rate && /tmp/indexer_wgmma_rate
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "dsv4/async_copy.h"
#include "dsv4/wgmma.h"

namespace {
using namespace dsv4;

enum Pattern { kPairChains, kPairChainsAndSums, kRowChains };
constexpr const char* kPatternNames[] = {"m64n128k32 chains", "m64n128k32 chains + ReLU-weighted sums",
                                         "m64n64k32 chains (row path)"};
constexpr int kThreads = 256;
constexpr int kSharedBytes = 64 * 1024 + 1024;

#if defined(DSV4_WGMMA)
// A chain over the 128 dims (four k32 steps) of one 64-key sub-tile, then the wait for it.
template <int kCount, class Multiply>
DSV4_DEVICE void run_chain(float (&acc)[kCount], uint32_t a_subtile, uint32_t b_tile, Multiply multiply) {
  pin_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    multiply(acc, swizzled_tile_descriptor(a_subtile + 32 * s), swizzled_tile_descriptor(b_tile + 32 * s),
             s > 0 ? 1u : 0u);
  }
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(acc);
}
#endif

template <Pattern kPattern>
__global__ void __launch_bounds__(kThreads, 2) chains_kernel(int iterations, float nan_sentinel, float* sink) {
#if defined(DSV4_WGMMA)
  extern __shared__ __align__(1024) uint8_t shared[];
  const uint32_t raw = shared_window_address(shared);
  const uint32_t base = swizzle_atom_aligned(raw);
  uint8_t* const generic = shared + (base - raw);
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(generic)[i] = (i & 1) != 0 ? 0x38383838u : 0u;  // e4m3 1.0 and 0
  }
  fence_shared_writes_for_wgmma();
  __syncthreads();
  const uint32_t keys = base + (threadIdx.x / 128) * 16384;  // 128 keys x 128 bytes a warp group
  const uint32_t q = base + 32768;                            // 2 rows x 64 heads x 128 bytes
  const float* weights = reinterpret_cast<const float*>(generic + 49152);
  const int lane = threadIdx.x % 32;
  float total = 0.0f;
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int subtile = 0; subtile < 2; ++subtile) {
      const uint32_t a = keys + subtile * 64 * 128;
      if constexpr (kPattern == kRowChains) {
        for (int row = 0; row < 2; ++row) {
          float acc[32];
          run_chain(acc, a, q + row * 8192,
                    [](auto& d, uint64_t x, uint64_t y, uint32_t c) { wgmma_m64n64k32(d, x, y, c); });
          total += acc[0] + acc[31];
        }
      } else {
        float acc[64];
        run_chain(acc, a, q, [](auto& d, uint64_t x, uint64_t y, uint32_t c) { wgmma_m64n128k32(d, x, y, c); });
        if constexpr (kPattern == kPairChainsAndSums) {
          // The decode kernel's add_weighted_relu over both rows: one max and one fused multiply-add an entry.
          const float2* w = reinterpret_cast<const float2*>(weights) + lane % 4;
          float low = 0.0f, high = 0.0f;
#pragma unroll
          for (int row = 0; row < 2; ++row) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float2 wj = w[32 * row + 4 * j];
              low = fmaf(wj.x, fmaxf(acc[32 * row + 4 * j], 0.0f), low);
              low = fmaf(wj.y, fmaxf(acc[32 * row + 4 * j + 1], 0.0f), low);
              high = fmaf(wj.x, fmaxf(acc[32 * row + 4 * j + 2], 0.0f), high);
              high = fmaf(wj.y, fmaxf(acc[32 * row + 4 * j + 3], 0.0f), high);
            }
          }
          total += low + high;
        } else {
          total += acc[0] + acc[63];
        }
      }
    }
  }
  if (total == nan_sentinel) sink[threadIdx.x] = total;  // keeps the sums live; a NaN equals nothing
#else
  (void)iterations;
  (void)nan_sentinel;
  (void)sink;
#endif
}

template <Pattern kPattern>
double tflops(int blocks, int iterations, float* sink) {
  cudaFuncSetAttribute(chains_kernel<kPattern>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  chains_kernel<kPattern><<<blocks, kThreads, kSharedBytes>>>(iterations, std::nanf(""), sink);  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  chains_kernel<kPattern><<<blocks, kThreads, kSharedBytes>>>(iterations, std::nanf(""), sink);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (cudaGetLastError() != cudaSuccess) return -1.0;
  // An iteration of a block: 2 warp groups x 2 sub-tiles x 64 keys x 128 columns (2 rows x 64 heads) x 128 dims.
  return 2.0 * blocks * iterations * 2 * 2 * 64 * 128 * 128 / (ms * 1e-3) / 1e12;
}

}  // namespace

int main() {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 1;
  float* sink = nullptr;
  cudaMalloc(&sink, kThreads * sizeof(float));
  constexpr int kIterations = 2000;
  for (int per_sm = 1; per_sm <= 2; ++per_sm) {
    const double rates[] = {tflops<kPairChains>(per_sm * sms, kIterations, sink),
                            tflops<kPairChainsAndSums>(per_sm * sms, kIterations, sink),
                            tflops<kRowChains>(per_sm * sms, kIterations, sink)};
    for (int p = 0; p < 3; ++p) {
      std::printf("%d block(s) an SM (%s): %.0f TFLOP/s\n", per_sm, kPatternNames[p], rates[p]);
    }
  }
  cudaFree(sink);
  return 0;
}
