// A session: one tenant's workspace on one device. It owns buffers and programs under
// session-scoped handles and holds a lease; closing it (or letting the lease expire)
// frees everything it owns.
//
// Every operation checks its input completely before it changes anything, so a failed
// operation leaves the session as it was. Operations of one session run one at a time
// in arrival order.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_SESSION_H_
#define REPLAYD_ENGINE_SESSION_H_

#include <atomic>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/driver.h"
#include "engine/call.h"
#include "engine/compile_cache.h"
#include "engine/handle_table.h"
#include "engine/program.h"

namespace replayd {

using SessionId = uint64_t;

// Device memory owned through a handle; freed when the last reference goes.
struct Buffer {
  Buffer(Context* context, Allocation allocation) : context(context), allocation(allocation) {}
  ~Buffer() { context->Free(allocation); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Context* const context;
  const Allocation allocation;
};

class Session {
 public:
  Session(SessionId id, std::string tenant, Device* device, std::unique_ptr<Context> context,
          CompileCache* compile_cache, absl::Duration lease);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  SessionId id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  const DeviceInfo& device() const { return device_->info(); }
  absl::Duration lease() const { return lease_; }

  // Pushes the lease deadline to now + lease.
  void Renew(absl::Time now);
  bool Expired(absl::Time now) const;

  // Frees every buffer and program; later operations are NOT_FOUND. Idempotent.
  void Close();

  // A new zeroed buffer. INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED past the
  // device's free memory.
  absl::StatusOr<Handle> AllocBuffer(uint64_t bytes);
  absl::Status FreeBuffer(Handle buffer);

  // The range [offset, offset + length) of `buffer` with a zero length meaning "to the
  // end", or INVALID_ARGUMENT / NOT_FOUND. Transfers check their whole range first.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> ResolveRange(Handle buffer, uint64_t offset,
                                                             uint64_t length);
  absl::Status WriteBuffer(Handle buffer, uint64_t offset, std::span<const uint8_t> bytes);
  absl::Status ReadBuffer(Handle buffer, uint64_t offset, std::span<uint8_t> bytes);

  // Compiles (through the compile cache) and loads a program.
  absl::StatusOr<ProgramInfo> LoadProgram(const ProgramSource& source);
  absl::Status FreeProgram(Handle program);

  // One eager launch, checked against the program's signature and the device limits.
  absl::StatusOr<LaunchResult> Launch(const LaunchOp& op);
  absl::Status Synchronize();

  // Bytes of device memory held by this session's buffers.
  uint64_t memory_in_use() const;

 private:
  absl::Status CheckOpen() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Buffer>> FindBuffer(Handle buffer) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status PackArgs(const Kernel& kernel, const LaunchOp& op, std::vector<ArgValue>& out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const SessionId id_;
  const std::string tenant_;
  Device* const device_;
  CompileCache* const compile_cache_;
  const absl::Duration lease_;
  std::atomic<int64_t> deadline_ns_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t memory_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // Declared after context_, so they are destroyed (and free their memory) before it.
  std::unique_ptr<Context> context_;
  HandleTable<Buffer> buffers_ ABSL_GUARDED_BY(mu_){"buffer"};
  HandleTable<Program> programs_ ABSL_GUARDED_BY(mu_){"program"};
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_SESSION_H_
