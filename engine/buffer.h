// A buffer: device memory of a fixed byte size on one context. A session owns it through
// a handle; a capture record and the graphs that hold it as a constant share it, so it
// stays until the last of them lets go, and is then freed on its context.
//
// Thread safety: immutable once made; the context frees it when the last reference goes.
#ifndef REPLAYD_ENGINE_BUFFER_H_
#define REPLAYD_ENGINE_BUFFER_H_

#include <memory>

#include "drivers/driver.h"

namespace replayd {

struct DeviceBuffer {
  DeviceBuffer(std::shared_ptr<Context> context, Allocation allocation)
      : context(std::move(context)), allocation(allocation) {}
  ~DeviceBuffer() { context->Free(allocation); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  const std::shared_ptr<Context> context;
  const Allocation allocation;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_BUFFER_H_
