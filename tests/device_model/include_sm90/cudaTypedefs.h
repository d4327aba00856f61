// The driver types the kernels of src/hip/ use for tensor maps (cp.async.bulk.tensor), on the model: a tensor
// map holds the encoder's arguments as they were given, and the model's TMA copy reads them back
// (dsv4/ptx.h here). Only the tiled encoder's arguments the kernels pass are modelled.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0 };
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle {
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B = 1,
  CU_TENSOR_MAP_SWIZZLE_64B = 2,
  CU_TENSOR_MAP_SWIZZLE_128B = 3,
};
enum CUtensorMapL2promotion { CU_TENSOR_MAP_L2_PROMOTION_NONE = 0, CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };

// Up to 3 dimensions of bytes (dimension 0 contiguous), as cuTensorMapEncodeTiled took them.
struct alignas(64) CUtensorMap {
  const unsigned char* global;
  uint32_t rank;
  uint64_t dims[3];
  uint64_t strides[3];  // bytes between consecutive indices of each dimension (strides[0] = 1)
  uint32_t box[3];
  CUtensorMapSwizzle swizzle;
};

using PFN_cuTensorMapEncodeTiled_v12000 = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                                       const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                                       const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                                       CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

namespace dsv4_sim {
// cuTensorMapEncodeTiled for byte tensors of rank 1 to 3 with unit element strides.
inline CUresult encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* global,
                                  const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                  const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                  CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (type != CU_TENSOR_MAP_DATA_TYPE_UINT8 || rank < 1 || rank > 3 || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *map = CUtensorMap{};
  map->global = static_cast<const unsigned char*>(global);
  map->rank = rank;
  map->strides[0] = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    if (element_strides[i] != 1) return CUDA_ERROR_INVALID_VALUE;
    map->dims[i] = dims[i];
    map->box[i] = box[i];
    if (i > 0) map->strides[i] = strides[i - 1];
  }
  map->swizzle = swizzle;
  return CUDA_SUCCESS;
}
}  // namespace dsv4_sim

// The runtime's way to the driver's functions: only the tensor-map encoder is there.
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
enum cudaGetDriverEntryPointFlags { cudaEnableDefault = 0 };
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned,
                                                    unsigned long long, cudaDriverEntryPointQueryResult* status) {
  const bool found = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  *function = found ? reinterpret_cast<void*>(&::dsv4_sim::encode_tensor_map) : nullptr;
  *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
