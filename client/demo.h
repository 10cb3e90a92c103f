// replayctl demo: a small real job on the daemon, checked against a host reference.
#ifndef REPLAYD_CLIENT_DEMO_H_
#define REPLAYD_CLIENT_DEMO_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"

namespace replayd::client {

// The C source of the shipped demo kernel file `name` ("matmul", "softmax").
std::string DemoKernel(const std::string& name);

// Runs a 256x256 matmul followed by a row softmax (five kernels) on `device`, checks
// the result against a host reference and prints a table to `out`. FAILED_PRECONDITION
// when the result is off by more than the tolerance.
absl::Status RunDemo(Client& client, const std::string& device, std::ostream& out);

}  // namespace replayd::client

#endif  // REPLAYD_CLIENT_DEMO_H_
