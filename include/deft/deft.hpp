// deft: deferred tensors. Tensors, their operations, autograd and the engine.
// What fewer programs use has its own header, so that the others do not
// parse it: deft/nn.hpp (networks), deft/data.hpp (IDX files,
// Fashion-MNIST, the DataLoader), deft/engine/profiler.hpp (Chrome traces
// of the tasks that ran), deft/engine/graph_dump.hpp (the pending task
// graph as DOT).
//
//   core/    shapes, dtypes, devices, errors
//   expr/    expression nodes (what), element functors, kernel views
//   eval/    evaluators per device (how): eval/cpu/ runs on xsimd
//   engine/  tasks, the scheduler and its thread pool (where and when)
//   ops/     the public vocabulary: elementwise operators and functions,
//            creation, random, reductions, softmax, linalg, convolutions,
//            slicing and joining (slice, concat, stack, one_hot), several
//            devices (split_and_load, allreduce)
//   io/      printing
//   autograd/ recording, derivatives of every operation, backward()
//
// Include this header (or nn.hpp, data.hpp): the files under deft/ are its
// parts, and autograd's hooks, which the operations call, are defined above
// them here.
#pragma once

#include "autograd/conv.hpp"
#include "autograd/graph.hpp"
#include "autograd/indexing.hpp"
#include "autograd/softmax.hpp"
#include "core/config.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/shape.hpp"
#include "engine/api.hpp"
#include "engine/engine.hpp"
#include "ops/elementwise.hpp"
#include "io/print.hpp"
#include "ops/conv.hpp"
#include "ops/creation.hpp"
#include "ops/devices.hpp"
#include "ops/indexing.hpp"
#include "ops/linalg.hpp"
#include "ops/random.hpp"
#include "ops/reduction.hpp"
#include "ops/softmax.hpp"
#include "tensor.hpp"
