// train_fashion_mnist compiled by nvcc against deft::cuda, so that
// --device gpu0 (and cpu,gpu0) runs its MLP or LeNet on a GPU: expressions on a GPU
// are instantiated where they are compiled (docs/gpu.md).
#include "train_fashion_mnist.cpp"
