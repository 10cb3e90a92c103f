#include "engine/dependencies.h"

#include <algorithm>

#include "engine/buffer.h"

namespace replayd {
namespace {

struct Use {
  SlotKind kind;
  uint32_t slot;
  uint64_t identity;  // constants: the buffer's address
  uint64_t begin, end;
  bool reads, writes;
};

std::vector<Use> UsesOf(const Graph& g, const GraphCall& call, std::span<const uint64_t> arena_offsets) {
  std::vector<Use> uses;
  for (size_t i = 0; i < call.args.size(); ++i) {
    const SlotView* v = std::get_if<SlotView>(&call.args[i]);
    if (!v) continue;
    const Slot& slot = g.slots[v->slot];
    uint64_t begin = v->offset, length = v->length ? v->length : slot.bytes - v->offset;
    if (slot.kind == SlotKind::kInternal) begin += arena_offsets[v->slot];
    const Access a = call.access(i);
    uses.push_back({slot.kind, v->slot, slot.kind == SlotKind::kConstant ? slot.constant->allocation.address : 0, begin,
                    begin + length, a == Access::kIn || a == Access::kInout, a == Access::kOut || a == Access::kInout});
  }
  return uses;
}

bool MayShareBytes(const Use& a, const Use& b) {
  const bool ranges = a.begin < b.end && b.begin < a.end;
  const bool a_internal = a.kind == SlotKind::kInternal, b_internal = b.kind == SlotKind::kInternal;
  if (a_internal || b_internal) return a_internal && b_internal && ranges;
  if (a.kind == SlotKind::kConstant && b.kind == SlotKind::kConstant) return a.identity == b.identity && ranges;
  if (a.kind == SlotKind::kParameter && b.kind == SlotKind::kParameter && a.slot == b.slot) return ranges;
  return true;  // a parameter may be any buffer, another parameter or a constant included
}

bool Conflict(const std::vector<Use>& earlier, const std::vector<Use>& later) {
  for (const Use& a : earlier)
    for (const Use& b : later)
      if ((a.writes || b.writes) && MayShareBytes(a, b)) return true;
  return false;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> DependencyEdges(const Graph& graph, std::span<const uint64_t> arena_offsets,
                                                       size_t begin, size_t end) {
  const size_t n = end - begin;
  std::vector<std::vector<Use>> uses(n);
  for (size_t i = 0; i < n; ++i) uses[i] = UsesOf(graph, graph.calls[begin + i], arena_offsets);
  // reach[j][i]: call i is already ordered before call j through the edges chosen.
  std::vector<std::vector<bool>> reach(n, std::vector<bool>(n, false));
  std::vector<std::pair<size_t, size_t>> edges;
  for (size_t j = 0; j < n; ++j) {
    // Latest first: an edge from a later call covers the earlier calls it already follows.
    for (size_t i = j; i-- > 0;) {
      if (reach[j][i] || !Conflict(uses[i], uses[j])) continue;
      edges.push_back({i, j});
      reach[j][i] = true;
      for (size_t k = 0; k < i; ++k)
        if (reach[i][k]) reach[j][k] = true;
    }
  }
  std::sort(edges.begin(), edges.end());
  return edges;
}

}  // namespace replayd
