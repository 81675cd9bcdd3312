// Per-thread work queues with stealing, for the CPU kernels' parallel loops (GEMM, attention).
//
// at::parallel_for splits a range statically: each OpenMP thread gets a fixed share and the region
// ends when the slowest share ends. On a machine whose cores are also running other processes (a
// server's HTTP and detokenizer processes, a benchmark client, a neighbour) one of the threads is
// often descheduled for a time slice, and its partner then spins at the region's barrier while the
// descheduled share waits. Here every thread still starts on its own share (its queue, in the order
// that keeps its data in its caches), but a thread whose queue is empty takes units from the back of
// the other queues (work stealing, as in Cilk: Blumofe & Leiserson 1999; TBB; OpenMP's dynamic
// schedule without its loss of locality when nobody is late). A unit's result never depends on which
// thread computes it (the kernels' units are independent outputs), so results stay bitwise the same.
//
// A queue is one 64-bit word: (next << 32) | end, units [next, end) left; the owner takes `next`
// (front), thieves take `end - 1` (back), each with one compare-and-swap.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace radixlm_parallel {

class StealQueues {
 public:
  explicit StealQueues(int64_t queues) : n_(queues), q_(new Slot[queues]) {}
  int64_t size() const { return n_; }
  // Queue t holds units [0, count) of its owner's list.
  void set(int64_t t, int64_t count) { q_[t].r.store(static_cast<uint64_t>(count), std::memory_order_relaxed); }

  // The owner's next unit (front), or -1 when queue t is empty.
  int64_t pop_front(int64_t t) {
    uint64_t r = q_[t].r.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t next = static_cast<uint32_t>(r >> 32), end = static_cast<uint32_t>(r);
      if (next >= end) return -1;
      const uint64_t taken = (static_cast<uint64_t>(next + 1) << 32) | end;
      if (q_[t].r.compare_exchange_weak(r, taken, std::memory_order_acq_rel, std::memory_order_relaxed)) return next;
    }
  }
  // A thief's unit from the back of queue t, or -1 when it is empty.
  int64_t pop_back(int64_t t) {
    uint64_t r = q_[t].r.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t next = static_cast<uint32_t>(r >> 32), end = static_cast<uint32_t>(r);
      if (next >= end) return -1;
      const uint64_t taken = (static_cast<uint64_t>(next) << 32) | (end - 1);
      if (q_[t].r.compare_exchange_weak(r, taken, std::memory_order_acq_rel, std::memory_order_relaxed)) return end - 1;
    }
  }

 private:
  struct alignas(64) Slot {  // a cache line each: one thread's pops do not move the other's line
    std::atomic<uint64_t> r{0};
  };
  int64_t n_;
  std::unique_ptr<Slot[]> q_;
};

// at::parallel_for's static split of n units over the pool's threads (at most n threads): thread t's
// share is units [begin(t), end(t)).
struct Shares {
  int64_t n, threads, per;
  explicit Shares(int64_t units)
      : n(units), threads(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units))),
        per((units + threads - 1) / threads) {}
  int64_t begin(int64_t t) const { return std::min(n, t * per); }
  int64_t end(int64_t t) const { return std::min(n, (t + 1) * per); }
  int64_t count(int64_t t) const { return end(t) - begin(t); }
};

// Runs fn(owner, unit) for every unit of `queues.size()` queues (queue t: units [0, counts(t)) of
// owner t's list), one queue per thread of torch's pool (at::parallel_for over the queues): a thread
// drains its own queue front to back, then steals from the back of the others. `body(begin, end, run)`
// is called once per pool thread with its queues [begin, end) and `run`, the drain loop, so the
// thread can set up its scratch first and clean up after: body calls run(fn) with an fn that uses it.
template <typename Counts, typename Body>
void parallel_steal(int64_t queues, Counts&& counts, Body&& body) {
  StealQueues q(queues);
  for (int64_t t = 0; t < queues; ++t) q.set(t, counts(t));
  at::parallel_for(0, queues, 1, [&](int64_t begin, int64_t end) {
    body(begin, end, [&](auto&& fn) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t u; (u = q.pop_front(t)) >= 0;) fn(t, u);
      }
      for (int64_t k = 1; k < queues; ++k) {  // then the others' backs, the next queue first
        const int64_t v = (begin + k) % queues;
        for (int64_t u; (u = q.pop_back(v)) >= 0;) fn(v, u);
      }
    });
  });
}

// Drop-in for at::parallel_for(begin, end, grain, f) with stealing: f(b, e) is called on units of up to
// `grain` indices; a thread takes the units of its own contiguous share (at::parallel_for's split)
// first. For loops whose iterations write disjoint outputs and keep no per-call scratch.
template <typename F>
void parallel_for_steal(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const Shares s((n + grain - 1) / grain);
  if (s.threads == 1 || at::in_parallel_region()) {
    f(begin, end);
    return;
  }
  parallel_steal(s.threads, [&](int64_t t) { return s.count(t); }, [&](int64_t, int64_t, auto&& run) {
    run([&](int64_t t, int64_t u) {
      const int64_t b = begin + (s.begin(t) + u) * grain;
      f(b, std::min(end, b + grain));
    });
  });
}

}  // namespace radixlm_parallel
