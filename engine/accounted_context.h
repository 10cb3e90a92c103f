// A session's context as the engine hands it out: the device's context with every
// allocation (buffers, graph arenas) counted against the tenant's memory quota first, so
// no path can allocate around the quota. RESOURCE_EXHAUSTED names the quota; nothing is
// allocated and the usage is unchanged. Everything else goes to the device's context.
//
// Thread safety: as the wrapped context.
#ifndef REPLAYD_ENGINE_ACCOUNTED_CONTEXT_H_
#define REPLAYD_ENGINE_ACCOUNTED_CONTEXT_H_

#include <memory>

#include "drivers/driver.h"
#include "engine/tenant.h"

namespace replayd {

class AccountedContext final : public Context {
 public:
  // `account` must outlive the context.
  AccountedContext(std::unique_ptr<Context> device_context, TenantAccount* account)
      : context_(std::move(device_context)), account_(account) {}

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override {
    if (absl::Status s = account_->Reserve(Resource::kMemory, bytes); !s.ok()) return s;
    absl::StatusOr<Allocation> a = context_->Allocate(bytes);
    if (!a.ok()) account_->Release(Resource::kMemory, bytes);
    return a;
  }
  void Free(const Allocation& allocation) override {
    context_->Free(allocation);
    account_->Release(Resource::kMemory, allocation.bytes);
  }
  absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) override {
    return context_->Write(dst, offset, bytes);
  }
  absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) override {
    return context_->Read(src, offset, bytes);
  }
  absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src,
                    uint64_t src_offset, uint64_t bytes) override {
    return context_->Copy(dst, dst_offset, src, src_offset, bytes);
  }
  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source,
                                               const std::filesystem::path& artifact) override {
    return context_->Load(source, artifact);
  }
  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel,
                                                       std::span<const ArgValue> args,
                                                       const Dim3& global, const Dim3& local,
                                                       bool wait) override {
    return context_->Launch(kernel, args, global, local, wait);
  }
  absl::Status Synchronize() override { return context_->Synchronize(); }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(
      std::span<const GraphNode> nodes, std::span<const std::pair<size_t, size_t>> edges) override {
    return context_->Instantiate(nodes, edges);
  }
  bool wants_edges() const override { return context_->wants_edges(); }
  bool CanBatch(const GraphNode& node) const override { return context_->CanBatch(node); }
  uint64_t address_space() const override { return context_->address_space(); }
  absl::Status health() const override { return context_->health(); }

 private:
  const std::unique_ptr<Context> context_;
  TenantAccount* const account_;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_ACCOUNTED_CONTEXT_H_
