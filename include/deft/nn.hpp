// deft::nn: Gluon-style networks on deft (blocks, layers, initializers,
// losses, optimizers and the Trainer, parameter files). float32.
#pragma once

#include "deft.hpp"
#include "nn/block.hpp"
#include "nn/checkpoint.hpp"
#include "nn/clip.hpp"
#include "nn/conv_layers.hpp"
#include "nn/init.hpp"
#include "nn/layers.hpp"
#include "nn/loss.hpp"
#include "nn/norm_layers.hpp"
#include "nn/optimizers.hpp"
#include "nn/resnet.hpp"
#include "nn/schedule.hpp"
#include "nn/serialize.hpp"
#include "nn/train_step.hpp"
#include "nn/trainer.hpp"
