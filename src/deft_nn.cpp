// deft::compiled: deft's nn (layers, Trainer), built once for every target that links it and uses nn.
#include <deft/nn_src.hpp>
