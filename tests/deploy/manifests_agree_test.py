"""The deployment files agree with each other and with the daemon.

The Kubernetes ConfigMap's config file is one replayd accepts (read back through
`replayd --config FILE --print_config`), and the DaemonSet, the Service and the systemd
unit match what it says: the probes and ports are the port it listens on, the tenants file
and the compile cache are where the volumes are, the scrape annotation names the metrics
port, and the grace periods outlast a drain.

    manifests_agree_test.py REPLAYD_BINARY DEPLOY_DIR     (exit 77: skipped, no PyYAML)
"""
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

# The drain's time where the config does not set it (kDefaultDrainSeconds in server/main.cc).
DEFAULT_DRAIN_SECONDS = 30
# How long past its grace the daemon's stop may take (kStopMargin in server/main.cc).
STOP_MARGIN_SECONDS = 5

REPLAYD = ""
DEPLOY = pathlib.Path()


def effective_config(text):
    """The config replayd makes of config file `text`: {field: value as text}."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "replayd.conf"
        path.write_text(text)
        run = subprocess.run([REPLAYD, "--config=" + str(path), "--print_config"], capture_output=True, text=True)
    if run.returncode != 0:
        raise AssertionError(f"replayd refused the config:\n{text}\n{run.stdout}{run.stderr}")
    config = {}
    for line in run.stdout.splitlines():
        match = re.fullmatch(r'(\w+): (?:"(.*)"|(\S+))', line)
        if match:
            config[match.group(1)] = match.group(2) if match.group(2) is not None else match.group(3)
    return config


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def host_of(address):
    return address.rsplit(":", 1)[0]


def stop_bound(config):
    """Seconds a stop of a daemon with `config` may take: its drain and the stop's margin."""
    return int(config.get("drain_seconds", DEFAULT_DRAIN_SECONDS)) + STOP_MARGIN_SECONDS


class KubernetesManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = {}
        for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    cls.objects[doc["kind"]] = doc
        cls.daemonset = cls.objects["DaemonSet"]
        cls.pod = cls.daemonset["spec"]["template"]
        cls.container = cls.pod["spec"]["containers"][0]
        cls.volumes = {v["name"]: v for v in cls.pod["spec"]["volumes"]}
        cls.mounts = {m["name"]: m for m in cls.container["volumeMounts"]}
        cls.ports = {p["name"]: p["containerPort"] for p in cls.container["ports"]}
        configmap = cls.objects["ConfigMap"]
        if len(configmap["data"]) != 1:
            raise AssertionError(f"the ConfigMap holds one file, the config: {list(configmap['data'])}")
        (cls.config_key, cls.config_text), = configmap["data"].items()
        cls.config = effective_config(cls.config_text)

    def mount_of(self, volume_kind):
        """The mount path of the pod's volume of `volume_kind` (configMap, secret)."""
        names = [n for n, v in self.volumes.items() if volume_kind in v]
        self.assertEqual(len(names), 1, f"one {volume_kind} volume")
        return self.mounts[names[0]]["mountPath"], self.volumes[names[0]][volume_kind]

    def test_the_daemon_reads_the_configmaps_file(self):
        mount, source = self.mount_of("configMap")
        self.assertEqual(source["name"], self.objects["ConfigMap"]["metadata"]["name"])
        self.assertIn(f"--config={mount}/{self.config_key}", self.container["args"])

    def test_the_tenants_file_comes_from_the_secret(self):
        mount, _ = self.mount_of("secret")
        self.assertTrue(self.config["tenants"].startswith(mount + "/"), self.config["tenants"])

    def test_the_compile_cache_is_on_a_writable_volume(self):
        cache = [n for n, m in self.mounts.items() if self.config["cache_dir"].startswith(m["mountPath"])]
        self.assertEqual(len(cache), 1, self.config["cache_dir"])
        self.assertIn("emptyDir", self.volumes[cache[0]])
        self.assertFalse(self.mounts[cache[0]].get("readOnly", False))

    def test_probes_and_ports_are_the_listening_port(self):
        listen = self.config["listen"]
        self.assertIn(host_of(listen), ("0.0.0.0", "[::]"), "the kubelet's probes come from outside the pod")
        self.assertEqual(self.ports["grpc"], port_of(listen))
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(self.container[probe]["grpc"]["port"], port_of(listen), probe)
        service_ports = {p["name"]: p for p in self.objects["Service"]["spec"]["ports"]}
        self.assertEqual(service_ports["grpc"]["targetPort"], "grpc")

    def test_readiness_asks_the_daemon_and_liveness_the_admin_service(self):
        # docs/operations.md: "" (or replayd.v1.Replayd) is NOT_SERVING while draining or
        # serving no device; replayd.v1.Admin is SERVING while the process runs.
        readiness = self.container["readinessProbe"]["grpc"].get("service", "")
        self.assertIn(readiness, ("", "replayd.v1.Replayd"))
        self.assertEqual(self.container["livenessProbe"]["grpc"].get("service"), "replayd.v1.Admin",
                         "a drain or a node without its GPU must not get the pod killed")

    def test_it_asks_for_a_gpu_on_gpu_nodes(self):
        self.assertEqual(int(self.container["resources"]["limits"]["nvidia.com/gpu"]), 1)
        self.assertTrue(self.pod["spec"]["nodeSelector"])
        # Readiness says whether the GPU is served only when no other kind is.
        self.assertEqual(self.config["devices"], "cuda")

    def test_the_scrape_annotation_names_the_metrics_port(self):
        annotations = self.pod["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(int(annotations["prometheus.io/port"]), self.ports["metrics"])
        if "metrics_listen" in self.config:  # a daemon with --metrics_listen must serve it there
            self.assertTrue(self.config["metrics_listen"], "the ConfigMap must set metrics_listen for the scrape")
            self.assertEqual(port_of(self.config["metrics_listen"]), self.ports["metrics"])
            self.assertIn(host_of(self.config["metrics_listen"]), ("0.0.0.0", "[::]"))

    def test_the_grace_period_outlasts_a_drain(self):
        self.assertGreater(self.pod["spec"]["terminationGracePeriodSeconds"], stop_bound(self.config))
        liveness = self.container["livenessProbe"]
        drain = int(self.config.get("drain_seconds", DEFAULT_DRAIN_SECONDS))
        self.assertGreater(liveness["periodSeconds"] * liveness["failureThreshold"], drain,
                           "a drain must not be cut short by a failed liveness probe")

    def test_the_service_is_headless_and_selects_the_pods(self):
        spec = self.objects["Service"]["spec"]
        self.assertEqual(spec["clusterIP"], "None")
        labels = self.pod["metadata"]["labels"]
        self.assertTrue(all(labels.get(k) == v for k, v in spec["selector"].items()))


class SystemdUnitTest(unittest.TestCase):
    def setUp(self):
        self.unit = {}
        for line in (DEPLOY / "replayd.service").read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                self.unit.setdefault(key, []).append(value)

    def test_it_reads_the_example_config(self):
        example = DEPLOY / "replayd.conf.example"
        start = self.unit["ExecStart"][0].split()
        self.assertIn("--config=/etc/replayd/replayd.conf", start)
        self.assertEqual(self.unit["ConfigurationDirectory"], ["replayd"])
        config = effective_config(example.read_text())
        self.assertEqual(config["cache_dir"], "/var/cache/replayd")
        self.assertEqual(self.unit["CacheDirectory"], ["replayd"])

    def test_a_stop_is_sigterm_to_the_daemon_with_time_to_drain(self):
        self.assertEqual(self.unit["KillSignal"], ["SIGTERM"])
        self.assertEqual(self.unit["KillMode"], ["mixed"])
        config = effective_config((DEPLOY / "replayd.conf.example").read_text())
        self.assertGreater(int(self.unit["TimeoutStopSec"][0]), stop_bound(config))


if __name__ == "__main__":
    REPLAYD, DEPLOY = sys.argv[1], pathlib.Path(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
