// deft's nn, compiled once. In the compiled mode (deft/src.hpp) the layers'
// key functions, and with them their vtables and forward passes, the layer
// templates' instances, the Trainer's steps, TrainStep's core, hybridized
// blocks' calls, parameter files and checkpoints are only declared in every
// translation unit; exactly one .cpp of a program that uses deft/nn.hpp
// defines them by including this header, first, before any other deft
// header. CMake's deft::compiled does it.
#pragma once

#if !defined(DEFT_SEPARATE_COMPILATION)
#error "deft/nn_src.hpp: define DEFT_SEPARATE_COMPILATION in every translation unit of the program (CMake: link deft::compiled)"
#endif
#if defined(DEFT_VERSION_MAJOR)
#error "deft/nn_src.hpp: include it before any other deft header, in a .cpp of its own"
#endif

#define DEFT_BUILDING_NN
#include "nn.hpp"
