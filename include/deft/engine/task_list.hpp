// TaskList: the task graph's edge lists, with room for a few references in
// place. Most tasks read one to three pending inputs and have one reader, so
// their lists cost no heap allocation (with supersede's lists, a tiny deferred
// op went from three allocations to one), and allocations that a worker frees
// for another thread are the slow ones (the allocator's per-thread caches miss).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace deft::detail {

class Task;

template <std::size_t N>
class TaskList {
 public:
  using value_type = std::shared_ptr<Task>;

  TaskList() = default;
  // Lists live inside their task and never move (data_ may point into storage_).
  TaskList(const TaskList&) = delete;
  TaskList& operator=(const TaskList&) = delete;
  ~TaskList() {
    clear();
    if (data_ != local()) ::operator delete(data_);
  }

  value_type* begin() { return data_; }
  value_type* end() { return data_ + size_; }
  const value_type* begin() const { return data_; }
  const value_type* end() const { return data_ + size_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  value_type& back() { return data_[size_ - 1]; }

  void push_back(value_type t) {
    if (size_ == capacity_) grow();
    ::new (static_cast<void*>(data_ + size_)) value_type(std::move(t));
    ++size_;
  }
  void pop_back() { data_[--size_].~value_type(); }
  /// Drops the references from the back (the storage stays for reuse).
  void clear() noexcept {
    while (size_ > 0) pop_back();
  }

 private:
  value_type* local() { return reinterpret_cast<value_type*>(storage_); }

  void grow() {
    const std::size_t capacity = capacity_ * 2;
    auto* fresh = static_cast<value_type*>(::operator new(capacity * sizeof(value_type)));
    for (std::size_t i = 0; i < size_; ++i) {
      ::new (static_cast<void*>(fresh + i)) value_type(std::move(data_[i]));
      data_[i].~value_type();
    }
    if (data_ != local()) ::operator delete(data_);
    data_ = fresh;
    capacity_ = capacity;
  }

  alignas(value_type) unsigned char storage_[N * sizeof(value_type)];
  value_type* data_ = local();
  std::size_t size_ = 0, capacity_ = N;
};

/// Tasks made ready to run, collected by a thread at a sync point or a
/// worker and handed to the pool (engine.hpp, thread_pool.hpp).
using ReadyList = TaskList<8>;

}  // namespace deft::detail
