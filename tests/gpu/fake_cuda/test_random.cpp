// The random programs of the device runner (test_random_device.cu), against the stand-in.
#include "../test_random_device.cu"
