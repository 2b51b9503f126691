// The derivatives of slice and concat (ops/indexing.hpp records their
// tasks): a slice's gradient is the upstream one placed in a zero tensor of
// the source's shape, a concatenation's is each part's slice of it. stack
// is a concatenation of views, so it needs nothing of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../ops/creation.hpp"
#include "../ops/indexing.hpp"
#include "graph.hpp"
#include "meta.hpp"

namespace deft::autograd::detail {

/// A copied slice [begin, begin + out extent) along `axis`.
template <class T>
struct SliceNode final : Node {
  Shape source;
  int axis;
  std::int64_t begin;
  SliceNode(const deft::detail::Leaf<T>& x, int a, std::int64_t b) : Node("slice"), source(x.extent), axis(a), begin(b) {
    inputs.push_back(x.grad);
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    Shape before = source, after = source;
    before[axis] = begin;
    after[axis] = source[axis] - begin - g.shape()[axis];
    const Tensor<T> parts[] = {zeros<T>(before, g.device()), g, zeros<T>(after, g.device())};
    accumulate<T>(*inputs[0], deft::detail::concat_tensors(std::span<const Tensor<T>>(parts), axis, "slice"));
  }
};

/// A concatenation along `axis`: each part's gradient is its slice.
template <class T>
struct ConcatNode final : Node {
  struct Part {
    std::shared_ptr<MetaBase> grad;
    std::int64_t begin, end;
  };
  std::vector<Part> parts;
  int axis;
  ConcatNode(const std::vector<deft::detail::Leaf<T>>& leaves, int a) : Node("concat"), axis(a) {
    std::int64_t at = 0;
    for (const auto& l : leaves) {
      if (l.grad) {
        parts.push_back({l.grad, at, at + l.extent[a]});
        inputs.push_back(l.grad);
      }
      at += l.extent[a];
    }
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    for (const Part& p : parts) accumulate<T>(*p.grad, slice(g, axis, p.begin, p.end));
  }
};

template <class T>
void track_slice(Tensor<T>& out, const deft::detail::Leaf<T>& in, int axis, std::int64_t begin) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<SliceNode<T>>(in, axis, begin)));
}

template <class T>
void track_concat(Tensor<T>& out, const std::vector<deft::detail::Leaf<T>>& parts, int axis) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<ConcatNode<T>>(parts, axis)));
}

}  // namespace deft::autograd::detail
