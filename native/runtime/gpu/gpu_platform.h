// The cuda and hip modules' one vocabulary: the gpu* names as the CUDA runtime's or HIP's (-DEB_GPU_HIP), and the
// few device intrinsics the two spell differently. Included by gpu_runtime.cu only.
//
// The hip module for the NVIDIA platform (-DEB_GPU_HIP_ON_CUDA, nvcc; setup.py with EXPERTBENCH_HIP_PLATFORM=nvidia)
// is the CUDA vocabulary under the hip module's name: on NVIDIA, HIP's calls are the CUDA runtime's, and its AMD
// intrinsics do not apply. ROCm 5.2's hip/nvidia_detail headers (Debian 12's libamdhip64-dev) do not compile
// against CUDA 13 (cudaDeviceProp lost clockRate, memoryClockRate and computeMode; cudaBindTexture is gone), so the
// mapping is this file's. It is a second runtime module with its own identity, streams, events and allocations:
// two owners in one process on one GPU, as a CUDA card beside an AMD APU are.
#ifndef EB_GPU_PLATFORM_H
#define EB_GPU_PLATFORM_H

#define PLATFORM "" /* the hip module for the NVIDIA platform says so in its kernel variant */
#ifdef EB_GPU_HIP
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define RUNTIME_NAME "hip"
#define API "HIP"
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemset hipMemset
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuStream_t hipStream_t
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamDestroy hipStreamDestroy
#define gpuEvent_t hipEvent_t
#define gpuEventCreate hipEventCreate
#define gpuEventRecord hipEventRecord
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventDestroy hipEventDestroy
#define gpuEventSynchronize hipEventSynchronize
#define gpuErrorNotReady hipErrorNotReady
#define gpuGetLastError hipGetLastError
#define SHFL_DOWN(v, o) __shfl_down((v), (o))
#define SHFL_XOR32(v, o) __shfl_xor((v), (o), 32)
#define SHFL_FROM(v, l) __shfl((v), (l))
#define SHFL_FROM32(v, l) __shfl((v), (l), 32)
#define WARP_SYNC() __builtin_amdgcn_wave_barrier() // a wavefront runs in lockstep: order its shared memory accesses
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphLaunch hipGraphLaunch
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#ifdef EB_GPU_HIP_ON_CUDA
#define RUNTIME_NAME "hip"
#define API "HIP"
#undef PLATFORM
#define PLATFORM " (CUDA platform)"
#else
#define RUNTIME_NAME "cuda"
#define API "CUDA"
#endif
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemset cudaMemset
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuStream_t cudaStream_t
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamDestroy cudaStreamDestroy
#define gpuEvent_t cudaEvent_t
#define gpuEventCreate cudaEventCreate
#define gpuEventRecord cudaEventRecord
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuEventSynchronize cudaEventSynchronize
#define gpuErrorNotReady cudaErrorNotReady
#define gpuGetLastError cudaGetLastError
#define SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define SHFL_XOR32(v, o) __shfl_xor_sync(0xffffffffu, (v), (o), 32)
#define SHFL_FROM(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define SHFL_FROM32(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#define WARP_SYNC() __syncwarp()
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphLaunch cudaGraphLaunch
#endif

#endif
