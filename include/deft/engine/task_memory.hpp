// Memory for tasks. Every statement allocates a task that holds its whole
// expression tree (about 1.2 KB with four operands), larger than what the C
// heap's per-thread cache serves (1032 bytes in glibc), and frees the task of
// the statement before: each such pair went through the heap's general bins
// (a tenth of a tiny statement's cost). Here each thread keeps a few freed
// blocks per size class, so that the pair is a pop and a push. Under
// AddressSanitizer a cached block is poisoned, so that a task touched after
// it was freed is still reported although the block skipped ASan's quarantine.
#pragma once
#include <array>
#include <cstddef>
#include <new>

#include "../core/config.hpp"
#include "../core/thresholds.hpp"

#if DEFT_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace deft::detail {

class TaskBlocks {
 public:
  static constexpr std::size_t granule = thresholds::task_block_granule;
  static constexpr int classes = thresholds::task_block_classes;

  // Out of line, both: every task type's allocation and its control block's
  // release call them, and inlined they were most of that per-type code.
  /// A block of at least `bytes` (aligned for any task).
  DEFT_NOINLINE static void* allocate(std::size_t bytes) {
    const std::size_t c = class_of(bytes);
    if (c < classes) {
      if (TaskBlocks* mine = local()) {
        if (Free* f = mine->heads_[c]) {
          unpoison(f, sizeof(Free));
          mine->heads_[c] = f->next;
          --mine->counts_[c];
          unpoison(f, block_bytes(c));
          return f;
        }
      }
      return ::operator new(block_bytes(c));
    }
    return ::operator new(bytes);
  }

  /// Returns a block from allocate(bytes), on any thread.
  DEFT_NOINLINE static void deallocate(void* p, std::size_t bytes) noexcept {
    const std::size_t c = class_of(bytes);
    if (c < classes) {
      if (TaskBlocks* mine = local(); mine && mine->counts_[c] < thresholds::task_blocks_kept) {
        mine->heads_[c] = new (p) Free{mine->heads_[c]};
        ++mine->counts_[c];
        poison(p, block_bytes(c));
        return;
      }
    }
    ::operator delete(p);
  }

  ~TaskBlocks() {
    gone() = true;  // tasks freed later on this thread (its other thread_locals, statics) go to the heap
    for (int c = 0; c < classes; ++c)
      for (Free* f = heads_[c]; f;) {
        unpoison(f, block_bytes(c));
        Free* next = f->next;
        ::operator delete(f);
        f = next;
      }
  }

 private:
  struct Free {
    Free* next;
  };
  static constexpr std::size_t class_of(std::size_t bytes) { return bytes == 0 ? 0 : (bytes - 1) / granule; }
  static constexpr std::size_t block_bytes(std::size_t c) { return (c + 1) * granule; }
  static void poison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#if DEFT_ASAN
    ASAN_POISON_MEMORY_REGION(p, n);
#endif
  }
  static void unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#if DEFT_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
  }
  // This thread's blocks; null once they were freed at thread exit.
  static TaskBlocks* local() {
    if (gone()) return nullptr;
    thread_local TaskBlocks blocks;
    return &blocks;
  }
  static bool& gone() {
    thread_local bool flag = false;  // trivially destructible: readable during thread exit
    return flag;
  }

  std::array<Free*, classes> heads_{};
  std::array<int, classes> counts_{};
};

/// The allocator of emplace_task's std::allocate_shared: the task, its
/// control block and `extra` bytes after them (the kernel, KernelTask) in
/// one TaskBlocks block.
template <class T>
struct TaskAllocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "deft: a task type needs more than operator new's alignment");
  std::size_t extra = 0;
  TaskAllocator() = default;
  explicit TaskAllocator(std::size_t extra_bytes) noexcept : extra(extra_bytes) {}
  template <class U>
  TaskAllocator(const TaskAllocator<U>& other) noexcept : extra(other.extra) {}
  T* allocate(std::size_t n) { return static_cast<T*>(TaskBlocks::allocate(n * sizeof(T) + extra)); }
  void deallocate(T* p, std::size_t n) noexcept { TaskBlocks::deallocate(p, n * sizeof(T) + extra); }
  template <class U>
  bool operator==(const TaskAllocator<U>& other) const noexcept { return extra == other.extra; }
};

}  // namespace deft::detail
