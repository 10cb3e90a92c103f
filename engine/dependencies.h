// Which earlier calls of a batch each call must wait for, for devices whose graphs run
// independent calls concurrently (a CUDA or HIP graph). Two calls depend on each other
// when a buffer argument of one may share bytes with a buffer argument of the other and
// at least one of them writes it (read after write, write after read, write after
// write). Edges implied by others are left out.
//
// What may share bytes: internals by their places in the arena (the memory plan reuses
// bytes across lifetimes); constants by buffer and range; a parameter with itself by
// range, and with any other parameter or constant, since a replay may pass the same
// buffer twice. Internals never share bytes with parameters or constants.
#ifndef REPLAYD_ENGINE_DEPENDENCIES_H_
#define REPLAYD_ENGINE_DEPENDENCIES_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/graph.h"

namespace replayd {

// Edges (from, to), indices into [begin, end), from < to, for the calls of `graph` in
// [begin, end). `arena_offsets[s]` is the arena offset of internal slot s (ignored for
// other slots). Runs once per batch at instantiation: quadratic in the batch's calls.
std::vector<std::pair<size_t, size_t>> DependencyEdges(const Graph& graph,
                                                       std::span<const uint64_t> arena_offsets,
                                                       size_t begin, size_t end);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_DEPENDENCIES_H_
