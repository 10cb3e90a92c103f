#include "engine/capture.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace replayd {

absl::StatusOr<CaptureRecord> CaptureRecord::Open(std::vector<CapturedBuffer> inputs,
                                                  std::vector<VariableDecl> variables) {
  if (absl::Status s = CheckGraphLimits(variables.size(), 0, 0); !s.ok()) return s;
  std::vector<std::shared_ptr<DeviceBuffer>> buffers;
  for (CapturedBuffer& input : inputs) {
    for (const auto& seen : buffers)
      if (seen == input.buffer)
        return absl::InvalidArgumentError(absl::StrCat("input buffer ", input.handle, " is named twice"));
    buffers.push_back(std::move(input.buffer));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    if (absl::Status s = CheckVariable(variables[i]); !s.ok()) return s;
    for (size_t j = 0; j < i; ++j)
      if (variables[j].name == variables[i].name)
        return absl::InvalidArgumentError(absl::StrCat("variable ", variables[i].name, " is declared twice"));
  }
  return CaptureRecord(std::move(buffers), std::move(variables));
}

void CaptureRecord::NoteAllocated(const DeviceBuffer& buffer) {
  born_.insert(&buffer);
  dropped_.erase(&buffer);
}

void CaptureRecord::NoteFreed(const DeviceBuffer& buffer) {
  if (born_.contains(&buffer)) dropped_.insert(&buffer);
}

absl::Status CaptureRecord::CheckRoom() const { return CheckGraphLimits(variables_.size(), 0, calls_.size() + 1); }

absl::Status CaptureRecord::RecordLaunch(std::shared_ptr<Program> program, std::vector<RecordedArg> args,
                                         const std::array<Expression, 3>& global,
                                         const std::array<Expression, 3>& local,
                                         std::span<const VariableDecl> variables) {
  // Map the call's variables onto the record's, by name; a new name becomes a new graph
  // variable. Checked before anything is added.
  std::vector<int> remap;
  std::vector<VariableDecl> added;
  for (const VariableDecl& v : variables) {
    int index = -1;
    for (size_t i = 0; i < variables_.size(); ++i)
      if (variables_[i].name == v.name) index = static_cast<int>(i);
    if (index >= 0 && !variables_[index].SameRange(v)) {
      const VariableDecl& c = variables_[index];
      return absl::InvalidArgumentError(absl::StrCat("variable ", v.name, " is bound with range [", v.min, ", ", v.max,
                                                     "] multiple of ", v.multiple_of, "; the capture declared [", c.min,
                                                     ", ", c.max, "] multiple of ", c.multiple_of));
    }
    if (index < 0) {
      index = static_cast<int>(variables_.size() + added.size());
      added.push_back(v);
    }
    remap.push_back(index);
  }
  if (absl::Status s = CheckGraphLimits(variables_.size() + added.size(), 0, calls_.size() + 1); !s.ok()) return s;
  RecordedCall call;
  call.program = std::move(program);
  call.args = std::move(args);
  for (RecordedArg& arg : call.args)
    if (Expression* e = std::get_if<Expression>(&arg)) *e = e->Remapped(remap);
  for (int d = 0; d < 3; ++d) {
    call.global[d] = global[d].Remapped(remap);
    call.local[d] = local[d].Remapped(remap);
  }
  call.added_variables = added.size();
  variables_.insert(variables_.end(), added.begin(), added.end());
  Add(std::move(call));
  return absl::OkStatus();
}

uint64_t CaptureRecord::HostBytes(const RecordedCall& call) {
  uint64_t bytes = sizeof(RecordedCall) + call.args.capacity() * sizeof(RecordedArg);
  auto expression = [&bytes](const Expression& e) { bytes += e.nodes().capacity() * sizeof(Expression::Node); };
  for (const RecordedArg& arg : call.args)
    if (const Expression* e = std::get_if<Expression>(&arg)) expression(*e);
  for (int d = 0; d < 3; ++d) {
    expression(call.global[d]);
    expression(call.local[d]);
  }
  return bytes + call.added_variables * sizeof(VariableDecl);
}

void CaptureRecord::Add(RecordedCall call) {
  host_bytes_ += HostBytes(call);
  calls_.push_back(std::move(call));
}

absl::Status CaptureRecord::RecordCopy(RecordedView dst, RecordedView src) {
  if (absl::Status s = CheckRoom(); !s.ok()) return s;
  RecordedCall call;
  call.args.push_back(std::move(dst));
  call.args.push_back(std::move(src));
  Add(std::move(call));
  return absl::OkStatus();
}

void CaptureRecord::ForgetLast() {
  if (calls_.empty()) return;
  variables_.resize(variables_.size() - calls_.back().added_variables);
  host_bytes_ -= HostBytes(calls_.back());
  calls_.pop_back();
}

Graph CaptureRecord::ToGraph(std::span<const std::shared_ptr<DeviceBuffer>> outputs) const {
  Graph g;
  g.variables = variables_;
  absl::flat_hash_map<const DeviceBuffer*, uint32_t> slot_of;
  auto add_parameter = [&](const std::shared_ptr<DeviceBuffer>& b) {
    if (slot_of.contains(b.get())) return;
    slot_of[b.get()] = static_cast<uint32_t>(g.slots.size());
    g.slots.push_back({SlotKind::kParameter, b->allocation.bytes, nullptr});
  };
  for (const auto& b : inputs_) add_parameter(b);
  for (const auto& b : outputs) add_parameter(b);
  for (const RecordedCall& rc : calls_) {
    GraphCall call;
    call.program = rc.program;
    call.global = rc.global;
    call.local = rc.local;
    for (const RecordedArg& arg : rc.args) {
      if (const Expression* e = std::get_if<Expression>(&arg)) {
        call.args.push_back(*e);
        continue;
      }
      const RecordedView& rv = std::get<RecordedView>(arg);
      auto [it, inserted] = slot_of.try_emplace(rv.buffer.get(), static_cast<uint32_t>(g.slots.size()));
      if (inserted) {
        if (dropped_.contains(rv.buffer.get())) {
          g.slots.push_back({SlotKind::kInternal, rv.buffer->allocation.bytes, nullptr});
        } else {
          g.slots.push_back({SlotKind::kConstant, rv.buffer->allocation.bytes, rv.buffer});
        }
      }
      call.args.push_back(SlotView{it->second, rv.view.offset, rv.view.length});
    }
    g.calls.push_back(std::move(call));
  }
  return g;
}

}  // namespace replayd
