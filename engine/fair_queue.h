// Weighted fair queueing over per-tenant FIFO queues of work items, by measured device
// time, in two priority classes. The pure policy: no threads, no clock of its own
// (callers pass the time), so it is tested deterministically; the Scheduler puts threads
// around it.
//
// Each queue has a virtual time: the device time charged to it divided by its weight.
// Of the waiting queues of a class, the one with the least virtual time goes next (the
// earliest to join on a tie), so queues that keep having work get device time in
// proportion to their weights, whatever their items cost. Costs are known only after an
// item has run and are charged then.
//
// A queue that empties keeps its virtual time. A session has one item at a time, so a
// tenant's queue is often empty for a moment between its items; it loses nothing by
// that (a deficit round robin drops the credit of an emptied queue, and with such
// sessions degrades to one item per tenant in turn, whatever the weights). A queue that
// comes back is moved up to at most one quantum behind the least virtual time of its
// class: while idle a tenant banks at most `quantum` times its weight of device time,
// so a pause in which the others gain more than that costs it the difference, and debt
// (a virtual time ahead of the others) is kept, so a tenant cannot clear it by pausing.
//
// Interactive queues go before batch queues. Batch work that waits is served at least
// once every `batch_max_wait` even while interactive work keeps coming.
//
// Thread safety: not thread-safe.
#ifndef REPLAYD_ENGINE_FAIR_QUEUE_H_
#define REPLAYD_ENGINE_FAIR_QUEUE_H_

#include <cstdint>
#include <vector>

#include "engine/tenant.h"

namespace replayd {

class FairQueue {
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
    int64_t virtual_ns = 0;  // charged device time / weight
    int64_t remainder = 0;   // of that division, carried to the next charge
    Item* head = nullptr;
    Item* tail = nullptr;
    size_t size = 0;
    bool waiting = false;  // in its class's list of waiting queues
  };

  struct Options {
    int64_t quantum_ns = 500'000;  // most device time banked while idle, times the weight
    int64_t batch_max_wait_ns = 20'000'000;
  };
  explicit FairQueue(Options options) : options_(options) {}

  // Appends `item` to `queue`.
  void Push(Queue* queue, Item* item, int64_t now_ns);
  // Removes and returns the next item to run, and sets *from to its queue; nullptr when
  // nothing waits.
  Item* Pop(int64_t now_ns, Queue** from);
  // Charges `cost_ns` of measured device time to `queue`, after its item ran.
  void Charge(Queue* queue, int64_t cost_ns);
  // Changes a queue's weight (1 or more) and class; a waiting queue moves to its new class.
  void SetShare(Queue* queue, uint32_t weight, Priority priority, int64_t now_ns);

  size_t waiting() const { return waiting_; }

 private:
  struct Class {
    std::vector<Queue*> queues;  // waiting, in the order they joined
    int64_t clock_ns = 0;        // the virtual time of the queue served last
  };
  Class& ClassOf(const Queue* q) { return classes_[q->priority == Priority::kInteractive ? 0 : 1]; }
  void Join(Queue* q, int64_t now_ns);
  void Leave(Queue* q);

  const Options options_;
  Class classes_[2];  // interactive, batch
  size_t waiting_ = 0;
  int64_t batch_waiting_since_ns_ = 0;
  int64_t batch_served_ns_ = 0;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_FAIR_QUEUE_H_
