#!/usr/bin/env bash
# The Kubernetes manifests of deploy/k8s pass yamllint in strict mode (warnings fail too)
# with the project's rules (yamllint.yaml beside this script).
#   k8s_yamllint_test.sh K8S_DIR                   (exit 77: skipped, no yamllint)
set -euo pipefail
k8s=$1
if ! command -v yamllint >/dev/null; then
  echo "SKIP: yamllint is not installed"
  exit 77
fi
yamllint --strict -c "$(dirname "$0")/yamllint.yaml" "$k8s"
echo "PASS: yamllint --strict $k8s"
