// The order the fake GPU runtimes run an instantiated graph's nodes in. A GPU runs nodes
// that no edge orders in any order, or side by side; running them in creation order, as
// a replay list does, would hide an edge the engine failed to make. So the fakes take a
// topological order that, of the nodes ready at each step, runs the one created last:
// nodes with no edge between them run in the reverse of their creation order wherever
// the edges allow, and a missing edge between two copies shows as a wrong result.
#ifndef REPLAYD_TESTS_SUPPORT_GRAPH_ORDER_H_
#define REPLAYD_TESTS_SUPPORT_GRAPH_ORDER_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace replayd::testing {

// The positions of `nodes` (each node's handle, in creation order, which is a topological
// one) in the order to run them; `deps_of(i)` is the handles node i depends on.
template <typename Handle, typename DepsOf>
std::vector<size_t> LatestReadyFirst(const std::vector<Handle>& nodes, DepsOf deps_of) {
  std::vector<size_t> order;
  std::vector<bool> done(nodes.size(), false);
  auto ran = [&](Handle h) {
    const auto it = std::find(nodes.begin(), nodes.end(), h);
    return it == nodes.end() || done[static_cast<size_t>(it - nodes.begin())];
  };
  while (order.size() < nodes.size()) {
    size_t next = nodes.size();
    for (size_t i = nodes.size(); i-- > 0;) {
      if (done[i]) continue;
      const auto& deps = deps_of(i);
      if (std::all_of(deps.begin(), deps.end(), ran)) {
        next = i;
        break;
      }
    }
    if (next == nodes.size()) break;  // a cycle: the fakes refuse dependencies on later nodes
    done[next] = true;
    order.push_back(next);
  }
  return order;
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_GRAPH_ORDER_H_
