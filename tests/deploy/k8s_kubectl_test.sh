#!/usr/bin/env bash
# `kubectl create --dry-run=client` reads the manifests of deploy/k8s without a cluster.
# kubectl still asks a server which kinds exist (discovery) before it maps a manifest to
# a resource, so the test gives it a kubeconfig for an address where nothing listens and
# a discovery cache, written here, that lists the kinds the manifests use: v1 ConfigMap,
# Secret, Service and apps/v1 DaemonSet, as every Kubernetes serves them. What it checks,
# then: every document parses as YAML into an object with apiVersion, kind and name; its
# kind is one of those, under the right apiVersion; and the objects are the ones listed
# below. It does not check fields against the API's schema (--validate needs a server's
# OpenAPI document). A copy with a misspelled kind must be refused, so that a pass means
# something.
#   k8s_kubectl_test.sh K8S_DIR                    (exit 77: skipped, no kubectl)
set -euo pipefail
k8s=$1
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl is not installed (Debian: kubernetes-client)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat > "$dir/kubeconfig" <<'END'
apiVersion: v1
kind: Config
clusters:
  - name: offline
    cluster: {server: "http://127.0.0.1:9"}
users:
  - name: offline
    user: {token: offline}
contexts:
  - name: offline
    context: {cluster: offline, user: offline, namespace: default}
current-context: offline
END
cache=$dir/cache/discovery/127.0.0.1_9
mkdir -p "$cache/v1" "$cache/apps/v1"
cat > "$cache/servergroups.json" <<'END'
{"kind": "APIGroupList", "apiVersion": "v1", "groups": [
  {"name": "", "versions": [{"groupVersion": "v1", "version": "v1"}],
   "preferredVersion": {"groupVersion": "v1", "version": "v1"}},
  {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
   "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}]}
END
resource() {  # name kind: an APIResourceList entry
  printf '{"name": "%s", "singularName": "", "namespaced": true, "kind": "%s", "verbs": ["create", "get"]}' "$1" "$2"
}
printf '{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [%s, %s, %s]}\n' \
  "$(resource configmaps ConfigMap)" "$(resource secrets Secret)" "$(resource services Service)" \
  > "$cache/v1/serverresources.json"
printf '{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1", "resources": [%s]}\n' \
  "$(resource daemonsets DaemonSet)" > "$cache/apps/v1/serverresources.json"

dry_run() {
  KUBECONFIG=$dir/kubeconfig kubectl create --dry-run=client --validate=false --cache-dir="$dir/cache" \
    -o name -f "$1" 2>&1
}

objects=$(dry_run "$k8s") || { echo "FAIL: kubectl create --dry-run=client -f $k8s:"; echo "$objects"; exit 1; }
expected=$'configmap/replayd-config\ndaemonset.apps/replayd\nservice/replayd'
if [ "$(sort <<<"$objects")" != "$expected" ]; then
  echo "FAIL: kubectl read these objects from $k8s:"
  echo "$objects"
  echo "expected:"
  echo "$expected"
  exit 1
fi

mkdir "$dir/broken"
sed 's/^kind: DaemonSet$/kind: DaemonSett/' "$k8s/daemonset.yaml" > "$dir/broken/daemonset.yaml"
if said=$(dry_run "$dir/broken/daemonset.yaml"); then
  echo "FAIL: kubectl accepted a misspelled kind, so its pass proves nothing: $said"
  exit 1
fi
echo "PASS: kubectl create --dry-run=client reads $(wc -l <<<"$objects") objects from $k8s and refuses a misspelled kind"
