#include "engine/fair_queue.h"

#include <algorithm>

namespace replayd {

void FairQueue::Push(Queue* q, Item* item, int64_t now_ns) {
  item->next = nullptr;
  item->enqueued_ns = now_ns;
  if (q->tail)
    q->tail->next = item;
  else
    q->head = item;
  q->tail = item;
  ++q->size;
  ++waiting_;
  if (!q->waiting) Join(q, now_ns);
}

void FairQueue::Join(Queue* q, int64_t now_ns) {
  Class& c = ClassOf(q);
  if (&c == &classes_[1] && c.queues.empty()) batch_waiting_since_ns_ = now_ns;
  // The least virtual time of the class now: of its waiting queues, or of the last served.
  int64_t least = c.clock_ns;
  for (const Queue* other : c.queues) least = std::min(least, other->virtual_ns);
  q->virtual_ns = std::max(q->virtual_ns, least - options_.quantum_ns);
  c.queues.push_back(q);
  q->waiting = true;
}

void FairQueue::Leave(Queue* q) {
  Class& c = ClassOf(q);
  c.queues.erase(std::find(c.queues.begin(), c.queues.end(), q));
  q->waiting = false;
}

FairQueue::Item* FairQueue::Pop(int64_t now_ns, Queue** from) {
  Class& interactive = classes_[0];
  Class& batch = classes_[1];
  Class* c = nullptr;
  if (!interactive.queues.empty()) c = &interactive;
  if (!batch.queues.empty()) {
    const int64_t since = std::max(batch_waiting_since_ns_, batch_served_ns_);
    if (!c || now_ns - since >= options_.batch_max_wait_ns) c = &batch;
  }
  if (!c) return nullptr;
  if (c == &batch) batch_served_ns_ = now_ns;
  Queue* q = c->queues.front();
  for (Queue* other : c->queues)
    if (other->virtual_ns < q->virtual_ns) q = other;
  c->clock_ns = std::max(c->clock_ns, q->virtual_ns);
  Item* item = q->head;
  q->head = item->next;
  if (!q->head) q->tail = nullptr;
  --q->size;
  --waiting_;
  if (q->size == 0) Leave(q);
  *from = q;
  return item;
}

void FairQueue::Charge(Queue* q, int64_t cost_ns) {
  const int64_t total = std::max<int64_t>(cost_ns, 0) + q->remainder;
  q->virtual_ns += total / q->weight;
  q->remainder = total % q->weight;
}

void FairQueue::SetShare(Queue* q, uint32_t weight, Priority priority, int64_t now_ns) {
  if (q->waiting && q->priority != priority) {
    Leave(q);
    q->priority = priority;
    Join(q, now_ns);
  } else {
    q->priority = priority;
  }
  q->weight = std::max<uint32_t>(weight, 1);
  q->remainder = 0;
}

}  // namespace replayd
