// Conversions between the driver interface's values and the executor protocol's messages.
#ifndef REPLAYD_DRIVERS_EXECUTOR_WIRE_H_
#define REPLAYD_DRIVERS_EXECUTOR_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/driver.h"
#include "drivers/executor/executor.pb.h"
#include "google/protobuf/repeated_field.h"

namespace replayd::executor {

inline void ToWire(const replayd::Dim3& d, executor::Dims& out) {
  out.set_x(d[0]);
  out.set_y(d[1]);
  out.set_z(d[2]);
}

inline replayd::Dim3 FromWire(const executor::Dims& d) { return {d.x(), d.y(), d.z()}; }

inline void ArgsToWire(std::span<const ArgValue> args, google::protobuf::RepeatedField<uint64_t>& out) {
  out.Reserve(static_cast<int>(args.size()));
  for (const ArgValue& a : args) out.Add(a.address);
}

inline std::vector<ArgValue> ArgsFromWire(const google::protobuf::RepeatedField<uint64_t>& args) {
  std::vector<ArgValue> out(args.size());
  for (int i = 0; i < args.size(); ++i) out[i].address = args[i];
  return out;
}

inline void ToWire(const ProgramSource& source, const std::string& artifact, executor::Load& out) {
  out.set_format(source.format);
  out.set_entry(source.entry);
  for (const replayd::Param& p : source.signature.params) {
    executor::Param* q = out.add_params();
    q->set_kind(static_cast<uint32_t>(p.kind));
    q->set_access(static_cast<uint32_t>(p.access));
  }
  out.set_core_id(source.signature.core_id);
  out.set_artifact(artifact);
}

// The source as far as loading needs it: format, entry and signature (not the code).
inline ProgramSource FromWire(const executor::Load& load) {
  ProgramSource source;
  source.format = load.format();
  source.entry = load.entry();
  for (const executor::Param& p : load.params()) {
    replayd::Param q;
    q.kind = p.kind() <= 2 ? static_cast<ParamKind>(p.kind()) : ParamKind::kInt64;
    q.access = p.access() <= 3 ? static_cast<Access>(p.access()) : Access::kNone;
    source.signature.params.push_back(q);
  }
  source.signature.core_id = load.core_id();
  return source;
}

// Where a device graph's values are in a launch's updates (GraphLaunch in executor.proto):
// each node's arguments, then its global and local sizes, the nodes in order; a value is
// named by its index there.
class GraphValues {
 public:
  static constexpr size_t kDimValues = 6;  // global x, y, z, then local

  // For nodes with these argument counts; INVALID_ARGUMENT past 2^32 values.
  static absl::StatusOr<GraphValues> For(std::span<const size_t> arg_counts) {
    GraphValues s;
    s.first_.reserve(arg_counts.size() + 1);
    uint64_t next = 0;
    for (size_t n : arg_counts) {
      s.first_.push_back(next);
      next += n + kDimValues;
      if (next > UINT32_MAX) return absl::InvalidArgumentError("a device graph of more than 2^32 values");
    }
    s.first_.push_back(next);
    s.node_of_.resize(next);
    for (size_t node = 0; node + 1 < s.first_.size(); ++node)
      std::fill(s.node_of_.begin() + s.first_[node], s.node_of_.begin() + s.first_[node + 1], node);
    return s;
  }

  size_t size() const { return node_of_.size(); }
  size_t nodes() const { return first_.size() - 1; }
  size_t first(size_t node) const { return first_[node]; }  // its first value's index
  size_t end(size_t node) const { return first_[node + 1]; }  // past its last
  size_t node_of(size_t index) const { return node_of_[index]; }

  // Node `node`'s values into `values` (size() of them).
  void Store(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local,
             std::span<uint64_t> values) const {
    uint64_t* v = values.data() + first_[node];
    for (const ArgValue& a : args) *v++ = a.address;
    for (uint64_t d : global) *v++ = d;
    for (uint64_t d : local) *v++ = d;
  }
  // Node `node`'s values from `values`; `args` is resized to its count.
  void Load(size_t node, std::span<const uint64_t> values, std::vector<ArgValue>& args, Dim3& global,
            Dim3& local) const {
    const uint64_t* v = values.data() + first_[node];
    args.resize(end(node) - first_[node] - kDimValues);
    for (ArgValue& a : args) a.address = *v++;
    for (uint64_t& d : global) d = *v++;
    for (uint64_t& d : local) d = *v++;
  }

 private:
  std::vector<uint64_t> first_;    // per node, and the total at the end
  std::vector<uint32_t> node_of_;  // per value
};

inline void SetTime(const std::optional<absl::Duration>& t, Reply& reply) {
  if (!t) return;
  reply.set_has_time(true);
  reply.set_device_time_ns(absl::ToInt64Nanoseconds(*t));
}

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_WIRE_H_
