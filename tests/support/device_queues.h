// The streams of a fake GPU runtime (tests/support/fake_cuda, fake_hip): work submitted
// to a stream is queued, and runs only when something waits for it, in submission order,
// as a GPU runs it some time after the call that submitted it. After a fault the device
// runs nothing more: what is queued is dropped as its turn comes.
//
// `Device` is the fake's state, with a `bool faulted`; the queues live in it and are
// used under its lock.
#ifndef REPLAYD_TESTS_SUPPORT_DEVICE_QUEUES_H_
#define REPLAYD_TESTS_SUPPORT_DEVICE_QUEUES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace replayd::testing {

template <typename Device>
class DeviceQueues {
 public:
  using Run = std::function<void(Device&)>;

  // Queues `run` on `queue` (a stream, or what stands for a default stream); `owner` (a
  // context, or null) is what RunAll can ask for.
  void Submit(const void* queue, const void* owner, Run run) {
    queued_[queue].push_back(Work{++submitted_, owner, std::move(run)});
  }

  // The number of the last work submitted, to any queue: an event recorded now follows it.
  uint64_t submitted() const { return submitted_; }

  // Runs `queue`'s work up to number `last`, in order.
  void RunQueue(Device& device, const void* queue, uint64_t last = UINT64_MAX) {
    auto it = queued_.find(queue);
    if (it == queued_.end()) return;
    while (!it->second.empty() && it->second.front().number <= last) {
      Work work = std::move(it->second.front());
      it->second.pop_front();
      if (!device.faulted) work.run(device);
    }
    if (it->second.empty()) queued_.erase(it);
  }

  // Runs every queue that holds some of `owner`'s work (every queue: null).
  void RunAll(Device& device, const void* owner = nullptr) {
    std::vector<const void*> queues;
    for (const auto& [queue, work] : queued_) {
      bool holds = !owner;
      for (const Work& w : work) holds = holds || w.owner == owner;
      if (holds) queues.push_back(queue);
    }
    for (const void* queue : queues) RunQueue(device, queue);
  }

  // Drops everything queued, as a reset does.
  void Clear() { queued_.clear(); }

 private:
  struct Work {
    uint64_t number;  // in submission order, over all queues
    const void* owner;
    Run run;
  };
  std::map<const void*, std::deque<Work>> queued_;
  uint64_t submitted_ = 0;
};

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_DEVICE_QUEUES_H_
