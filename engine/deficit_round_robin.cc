#include "engine/deficit_round_robin.h"

#include <algorithm>
#include <limits>

namespace replayd {

void DeficitRoundRobin::Push(Queue* q, Item* item, int64_t now_ns) {
  item->next = nullptr;
  item->enqueued_ns = now_ns;
  if (q->tail) q->tail->next = item; else q->head = item;
  q->tail = item;
  ++q->size;
  ++waiting_;
  if (!q->in_ring) Join(q, now_ns);
}

void DeficitRoundRobin::Join(Queue* q, int64_t now_ns) {
  Ring& ring = RingOf(q);
  if (&ring == &rings_[1] && ring.queues.empty()) batch_waiting_since_ns_ = now_ns;
  ring.queues.push_back(q);
  q->in_ring = true;
  // The first queue of a ring is its current one and gets its visit's credit now; later
  // ones get it when the round reaches them.
  if (ring.queues.size() == 1) {
    ring.current = 0;
    Credit(q);
  }
}

void DeficitRoundRobin::Leave(Queue* q) {
  Ring& ring = RingOf(q);
  auto it = std::find(ring.queues.begin(), ring.queues.end(), q);
  const size_t index = static_cast<size_t>(it - ring.queues.begin());
  ring.queues.erase(it);
  q->in_ring = false;
  q->deficit = std::min<int64_t>(q->deficit, 0);
  if (ring.queues.empty()) {
    ring.current = 0;
    return;
  }
  if (index < ring.current) {
    --ring.current;
  } else if (index == ring.current) {
    // The round moves on to the queue that took its place.
    if (ring.current == ring.queues.size()) ring.current = 0;
    Credit(ring.queues[ring.current]);
  }
}

DeficitRoundRobin::Queue* DeficitRoundRobin::Choose(Ring& ring) {
  const size_t n = ring.queues.size();
  for (;;) {
    for (size_t visited = 0; visited <= n; ++visited) {
      Queue* q = ring.queues[ring.current];
      if (q->deficit > 0) return q;
      ring.current = (ring.current + 1) % n;
      Credit(ring.queues[ring.current]);
    }
    // Every queue is in debt: pass the rounds that would serve nobody at once.
    int64_t rounds = std::numeric_limits<int64_t>::max();
    for (const Queue* q : ring.queues)
      rounds = std::min(rounds, -q->deficit / (options_.quantum_ns * q->weight));
    for (Queue* q : ring.queues) q->deficit += rounds * options_.quantum_ns * q->weight;
  }
}

DeficitRoundRobin::Item* DeficitRoundRobin::Pop(int64_t now_ns, Queue** from) {
  Ring& interactive = rings_[0];
  Ring& batch = rings_[1];
  Ring* ring = nullptr;
  if (!interactive.queues.empty()) ring = &interactive;
  if (!batch.queues.empty()) {
    const int64_t since = std::max(batch_waiting_since_ns_, batch_served_ns_);
    if (!ring || now_ns - since >= options_.batch_max_wait_ns) ring = &batch;
  }
  if (!ring) return nullptr;
  if (ring == &batch) batch_served_ns_ = now_ns;
  Queue* q = Choose(*ring);
  Item* item = q->head;
  q->head = item->next;
  if (!q->head) q->tail = nullptr;
  --q->size;
  --waiting_;
  if (q->size == 0) Leave(q);
  *from = q;
  return item;
}

void DeficitRoundRobin::SetShare(Queue* q, uint32_t weight, Priority priority, int64_t now_ns) {
  const bool waiting = q->in_ring;
  if (waiting && q->priority != priority) {
    const int64_t deficit = q->deficit;
    Leave(q);
    q->priority = priority;
    q->deficit = deficit;
    Join(q, now_ns);
  } else {
    q->priority = priority;
  }
  q->weight = std::max<uint32_t>(weight, 1);
}

}  // namespace replayd
