// Weighted deficit round robin over per-tenant FIFO queues of work items, in two priority
// classes. The pure policy: no threads, no clock of its own (callers pass the time), so
// it is tested deterministically; the Scheduler puts threads around it.
//
// Costs are known only after an item has run, so a queue is served while its deficit is
// positive and charged afterwards: it may overdraw by one item, and that debt is kept
// (also when it goes idle), so a tenant cannot clear it by pausing. Unused credit is
// dropped when a queue empties, as in classic DRR. Over time, queues that always have
// work get cost in proportion to their weights.
//
// Interactive queues go before batch queues. Batch work that waits is served at least
// once every `batch_max_wait` even while interactive work keeps coming.
//
// Thread safety: not thread-safe.
#ifndef REPLAYD_ENGINE_DEFICIT_ROUND_ROBIN_H_
#define REPLAYD_ENGINE_DEFICIT_ROUND_ROBIN_H_

#include <cstdint>
#include <vector>

#include "engine/tenant.h"

namespace replayd {

class DeficitRoundRobin {
 public:
  // A waiting work item; intrusive, so queueing allocates nothing.
  struct Item {
    Item* next = nullptr;
    int64_t enqueued_ns = 0;
  };
  // One tenant's queue. Created by the caller, which keeps it alive while it is used.
  struct Queue {
    uint32_t weight = 1;
    Priority priority = Priority::kBatch;
    int64_t deficit = 0;
    Item* head = nullptr;
    Item* tail = nullptr;
    size_t size = 0;
    bool in_ring = false;
  };

  struct Options {
    int64_t quantum_ns = 500'000;          // credit per visit, times the weight
    int64_t batch_max_wait_ns = 20'000'000;
  };
  explicit DeficitRoundRobin(Options options) : options_(options) {}

  // Appends `item` to `queue`.
  void Push(Queue* queue, Item* item, int64_t now_ns);
  // Removes and returns the next item to run, and sets *from to its queue; nullptr when
  // nothing waits.
  Item* Pop(int64_t now_ns, Queue** from);
  // Charges `cost_ns` of measured device time to `queue`, after its item ran.
  void Charge(Queue* queue, int64_t cost_ns) { queue->deficit -= cost_ns; }
  // Changes a queue's weight (1 or more) and class; a waiting queue moves to its new ring.
  void SetShare(Queue* queue, uint32_t weight, Priority priority, int64_t now_ns);

  size_t waiting() const { return waiting_; }

 private:
  struct Ring {
    std::vector<Queue*> queues;
    size_t current = 0;
  };
  Ring& RingOf(const Queue* q) { return rings_[q->priority == Priority::kInteractive ? 0 : 1]; }
  void Join(Queue* q, int64_t now_ns);
  void Leave(Queue* q);
  void Credit(Queue* q) const { q->deficit += options_.quantum_ns * q->weight; }
  // The queue of `ring` to serve next, crediting queues as the round passes them.
  Queue* Choose(Ring& ring);

  const Options options_;
  Ring rings_[2];  // interactive, batch
  size_t waiting_ = 0;
  int64_t batch_waiting_since_ns_ = 0;
  int64_t batch_served_ns_ = 0;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_DEFICIT_ROUND_ROBIN_H_
