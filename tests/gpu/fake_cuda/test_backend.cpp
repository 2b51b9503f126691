// The device runner's tests (test_kernels_device.cu), compiled by g++
// against the stand-in: deft's CUDA backend itself, its streams, events,
// copies, graphs, cuBLAS and NCCL calls, run on machines without a GPU.
#include "../test_kernels_device.cu"
