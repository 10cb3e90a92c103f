#include "engine/call.h"

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace replayd {

absl::StatusOr<BoundValues> CheckBoundVariables(const std::vector<BoundVariable>& bound) {
  BoundValues out;
  absl::flat_hash_set<absl::string_view> names;
  for (const BoundVariable& b : bound) {
    if (absl::Status s = CheckVariable(b.variable); !s.ok()) return s;
    if (!names.insert(b.variable.name).second)
      return absl::InvalidArgumentError(absl::StrCat("variable ", b.variable.name, " is bound twice"));
    if (absl::Status s = CheckValue(b.variable, b.value); !s.ok()) return s;
    out.variables.push_back(b.variable);
    out.values.push_back(b.value);
  }
  return out;
}

absl::StatusOr<int64_t> EvaluateChecked(const Expression& e, std::span<const VariableDecl> variables,
                                        std::span<const int64_t> values) {
  absl::StatusOr<Interval> bounds = e.Bounds(variables);
  if (!bounds.ok()) return bounds.status();
  return e.Evaluate(values);
}

absl::StatusOr<Dim3> CheckDims(const std::vector<uint64_t>& dims, const Dim3& max, uint64_t max_total,
                               absl::string_view what) {
  if (dims.size() > 3)
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", dims.size(), " dimensions; at most 3"));
  Dim3 d{1, 1, 1};
  uint64_t total = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] is 0"));
    if (dims[i] > max[i])
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "] = ", dims[i], " exceeds the device limit ", max[i]));
    d[i] = dims[i];
    // Each factor is at most max[i], so check before multiplying to avoid overflow.
    if (total > max_total / d[i])
      return absl::InvalidArgumentError(absl::StrCat(what, " total exceeds the device limit ", max_total));
    total *= d[i];
  }
  return d;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> ResolveView(const ViewArg& view, uint64_t size) {
  if (view.offset >= size)
    return absl::InvalidArgumentError(
        absl::StrCat("view of buffer ", view.buffer, " at offset ", view.offset, " is outside its ", size, " bytes"));
  uint64_t length = view.length ? view.length : size - view.offset;
  if (length > size - view.offset)
    return absl::InvalidArgumentError(absl::StrCat("view of buffer ", view.buffer, ": ", length, " bytes at offset ",
                                                   view.offset, " exceed its size ", size));
  return std::make_pair(view.offset, length);
}

absl::StatusOr<uint64_t> CheckCopyRanges(std::pair<uint64_t, uint64_t> dst, std::pair<uint64_t, uint64_t> src,
                                         bool same_buffer) {
  if (dst.second != src.second)
    return absl::InvalidArgumentError(
        absl::StrCat("a copy needs views of one length: destination ", dst.second, " bytes, source ", src.second));
  if (same_buffer && dst.first < src.first + src.second && src.first < dst.first + dst.second)
    return absl::InvalidArgumentError(absl::StrCat("a copy between overlapping ranges of one buffer: [", dst.first,
                                                   ", ", dst.first + dst.second, ") and [", src.first, ", ",
                                                   src.first + src.second, ")"));
  return dst.second;
}

absl::StatusOr<std::optional<absl::Duration>> SubmitCopy(Context& context, uint64_t dst, uint64_t src, uint64_t bytes,
                                                         bool wait) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = context.Copy({dst, bytes}, 0, {src, bytes}, 0, bytes); !s.ok()) return s;
  if (!wait) return std::optional<absl::Duration>();
  if (absl::Status s = context.Synchronize(); !s.ok()) return s;
  return std::optional<absl::Duration>(absl::FromChrono(std::chrono::steady_clock::now() - start));
}

}  // namespace replayd
