// Working memory a kernel call takes from its thread's own buffers, kept from call to call.
// The kernels run inside parallel regions, and the engine keeps a single malloc arena
// (memory/host_malloc.py): memory allocated per call there makes the threads queue on that
// arena's lock, each wait a futex sleep and wake-up.
#pragma once

#include <cstddef>
#include <vector>

namespace radixserve {

// n values of T for the calling thread (contents left from its last use: set what is read).
// Buffers used at the same time need different tags.
template <typename T, int kTag>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace radixserve
