#include "engine/replay.h"

#include "absl/strings/str_cat.h"

namespace replayd {

absl::Status ResolveParams(const GraphInstance& graph, std::span<const ParamValue> params,
                           const HandleTable<DeviceBuffer>& buffers, std::vector<uint64_t>& addresses,
                           std::vector<int64_t>& values) {
  const std::vector<uint32_t>& buffer_params = graph.buffer_params();
  const std::vector<VariableDecl>& variables = graph.graph().variables;
  const size_t expected = buffer_params.size() + variables.size();
  if (params.size() != expected) {
    std::string missing;
    if (params.size() < buffer_params.size())
      missing = absl::StrCat(" (buffer parameter ", params.size(), " is missing)");
    else if (params.size() < expected)
      missing = absl::StrCat(" (variable ", variables[params.size() - buffer_params.size()].name, " is missing)");
    return absl::InvalidArgumentError(
        absl::StrCat("the graph takes ", expected, " parameters, got ", params.size(), missing));
  }
  addresses.resize(buffer_params.size());
  values.resize(variables.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (i < buffer_params.size()) {
      const BufferParam* bp = std::get_if<BufferParam>(&params[i]);
      if (!bp) return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " must be a buffer"));
      absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = buffers.Find(bp->buffer);
      if (!b.ok()) return absl::NotFoundError(absl::StrCat("parameter ", i, ": ", b.status().message()));
      uint64_t need = graph.graph().slots[buffer_params[i]].bytes;
      if ((*b)->allocation.bytes < need)
        return absl::InvalidArgumentError(absl::StrCat("parameter ", i, ": buffer ", bp->buffer, " has ",
                                                       (*b)->allocation.bytes, " bytes; the graph needs ", need));
      addresses[i] = (*b)->allocation.address;
      continue;
    }
    const VariableDecl& var = variables[i - buffer_params.size()];
    const int64_t* v = std::get_if<int64_t>(&params[i]);
    if (!v)
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " (variable ", var.name, ") must be a value"));
    if (absl::Status s = CheckValue(var, *v); !s.ok()) return s;
    values[i - buffer_params.size()] = *v;
  }
  return graph.CheckBuffers(addresses);
}

absl::Status ResolveReads(std::span<const ViewArg> reads, const HandleTable<DeviceBuffer>& buffers,
                          std::vector<ResolvedRead>& out) {
  out.clear();
  uint64_t total = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = buffers.Find(reads[i].buffer);
    if (!b.ok()) return absl::NotFoundError(absl::StrCat("read ", i, ": ", b.status().message()));
    absl::StatusOr<std::pair<uint64_t, uint64_t>> r = ResolveView(reads[i], (*b)->allocation.bytes);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("read ", i, ": ", r.status().message()));
    total += r->second;
    if (total > kMaxReplayReadBytes)
      return absl::InvalidArgumentError(absl::StrCat("reads exceed ", kMaxReplayReadBytes, " bytes in all"));
    out.push_back({*b, r->first, r->second});
  }
  return absl::OkStatus();
}

absl::Status TakeReads(Context& context, std::span<const ResolvedRead> reads, std::vector<std::string>& out) {
  out.resize(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    out[i].resize(reads[i].length);
    absl::Status s = context.Read(reads[i].buffer->allocation, reads[i].offset,
                                  {reinterpret_cast<uint8_t*>(out[i].data()), reads[i].length});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceVectors> SequenceVectors::Check(const GraphInstance& graph, const ReplaySequenceOp& op,
                                                       const HandleTable<DeviceBuffer>& buffers) {
  const bool stepping = op.vectors.empty();
  SequenceVectors seq;
  seq.count_ = stepping ? op.count : op.vectors.size();
  if (seq.count_ == 0 || seq.count_ > kMaxSequenceReplays)
    return absl::InvalidArgumentError(
        absl::StrCat("a sequence runs 1 to ", kMaxSequenceReplays, " replays, not ", seq.count_));
  if (!stepping && (op.count != 0 || !op.base.empty()))
    return absl::InvalidArgumentError("a sequence takes vectors or a base with a step, not both");
  seq.addresses_.resize(stepping ? 1 : seq.count_);
  seq.values_.resize(stepping ? 1 : seq.count_);
  if (!stepping) {
    for (uint64_t i = 0; i < seq.count_; ++i) {
      absl::Status s = ResolveParams(graph, op.vectors[i], buffers, seq.addresses_[i], seq.values_[i]);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replay ", i, ": ", s.message()));
    }
    return seq;
  }
  // With a step, the first and the last values bound the rest, and a step that is a
  // multiple keeps every value one.
  if (absl::Status s = ResolveParams(graph, op.base, buffers, seq.addresses_[0], seq.values_[0]); !s.ok()) return s;
  const size_t first_var = graph.buffer_params().size();
  if (op.step_param < first_var || op.step_param >= op.base.size())
    return absl::InvalidArgumentError(absl::StrCat("step_param ", op.step_param, " is not a variable parameter"));
  const size_t stepped = op.step_param - first_var;
  const VariableDecl& var = graph.graph().variables[stepped];
  int64_t span, last;
  if (__builtin_mul_overflow(static_cast<int64_t>(seq.count_ - 1), op.step, &span) ||
      __builtin_add_overflow(seq.values_[0][stepped], span, &last))
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name, " overflows over the sequence"));
  if (absl::Status s = CheckValue(var, last); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("replay ", seq.count_ - 1, ": ", s.message()));
  if (op.step % var.multiple_of != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("step ", op.step, " of variable ", var.name, " is not a multiple of ", var.multiple_of));
  seq.stepped_ = stepped;
  seq.first_ = seq.values_[0][stepped];
  seq.step_ = op.step;
  return seq;
}

std::span<const uint64_t> SequenceVectors::addresses(uint64_t replay) const {
  return addresses_[stepped_ ? 0 : replay];
}

std::span<const int64_t> SequenceVectors::ValuesOf(uint64_t replay) {
  if (!stepped_) return values_[replay];
  // Within the span Check bounded: no overflow.
  values_[0][*stepped_] = first_ + static_cast<int64_t>(replay) * step_;
  return values_[0];
}

}  // namespace replayd
