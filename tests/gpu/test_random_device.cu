// The random programs of random_checks.hpp on a real GPU: part of the
// deft_gpu_kernels_device runner (test_kernels_device.cu has its main), in
// a translation unit of its own so that nvcc compiles the two side by side.
#include <boost/test/unit_test.hpp>

#include "random_checks.hpp"

BOOST_AUTO_TEST_SUITE(gpu_kernels)

DEFT_GPU_RANDOM_CASES

BOOST_AUTO_TEST_SUITE_END()
