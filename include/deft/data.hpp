// deft::data: IDX files (gzip included), Fashion-MNIST and the DataLoader.
// Apart from deft/deft.hpp, which most programs include without needing
// these.
#pragma once

#include "data/fashion_mnist.hpp"
#include "data/idx.hpp"
#include "data/loader.hpp"
#include "deft.hpp"
