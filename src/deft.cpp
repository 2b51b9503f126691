// deft::compiled: deft's runtime, built once for every target that links it.
#include <deft/src.hpp>
