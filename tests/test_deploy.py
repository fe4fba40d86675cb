"""deploy/: the manifests, the plain-Kubernetes entrypoint and the image, short of a cluster
(none is reachable here); and one run per kind where every task gets exactly the host names
and TF_CONFIG its pod would get (marked `cluster`: it makes network namespaces)."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ACCURACY_BAR, DISTRIBUTED_EXAMPLES, ROOT, error_lines, load_train_module
from test_cluster import (assert_run_left_nothing, missing_for_namespaces, start_tool,
                          summary_of)

sys.path.insert(0, os.path.join(ROOT, "deploy"))
import entrypoint  # noqa: E402  (deploy/ is not a package)
import manifests  # noqa: E402

DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")


def generate(*argv):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py")]
                         + list(argv), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {d["kind"] + ("/" + d["metadata"]["name"] if d["kind"] == "Job" else ""): d
            for d in yaml.safe_load_all(out.stdout)}


def resolve(tf_config, monkeypatch):
    """What an example's train.py makes of a TF_CONFIG: (cluster, job, index)."""
    module = load_train_module("Distributed-Setup")
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    args = module.parse_flags([], module.example_flags)
    cluster = module.resolve_cluster(args)
    return cluster, args.job_name, args.task_index


# --- The manifests --------------------------------------------------------------------------------
def test_every_distributed_example_can_be_deployed_and_the_baseline_cannot():
    assert manifests.examples() == DISTRIBUTED_EXAMPLES
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py"),
                          "Non-Distributed-Setup", "--image", "x"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and len(error_lines(out.stderr)) == 1, out.stderr
    assert "not an example that runs as a cluster" in out.stderr


@pytest.mark.parametrize("example", DISTRIBUTED_EXAMPLES)
def test_the_tfjob_has_what_the_operator_needs(example):
    docs = generate(example, "--image", "registry.test/dtfg:1", "--ps", "2", "--workers", "3")
    job = docs["TFJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    replicas = job["spec"]["tfReplicaSpecs"]
    assert sorted(replicas) == ["PS", "Worker"]
    assert (replicas["PS"]["replicas"], replicas["Worker"]["replicas"]) == (2, 3)
    assert (replicas["PS"]["restartPolicy"], replicas["Worker"]["restartPolicy"]) == (
        "Never", "OnFailure")
    for spec in replicas.values():
        (c,) = spec["template"]["spec"]["containers"]
        assert c["name"] == "tensorflow"  # the operator writes TF_CONFIG only into this one
        assert c["image"] == "registry.test/dtfg:1"
        assert c["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert c["command"] == ["python", "/app/%s/train.py" % example]
        assert "env" not in c  # TF_CONFIG comes from the operator
    assert_only_the_runs_pods_get_in(docs["NetworkPolicy"], job["metadata"]["name"])


@pytest.mark.parametrize("example", DISTRIBUTED_EXAMPLES)
def test_the_plain_manifest_is_a_headless_service_and_two_indexed_jobs(example):
    name = example.lower()
    docs = generate(example, "--kind", "plain", "--image", "img", "--workers", "3",
                    "--volume_claim", "logs", "--", "--steps", "5000")
    service = docs["Service"]
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == name
    assert service["spec"]["selector"] == {"dtfg/run": name}
    for role, n, restart in (("ps", 1, "Never"), ("worker", 3, "OnFailure")):
        job = docs["Job/%s-%s" % (name, role)]["spec"]
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == n
        pod = job["template"]["spec"]
        assert pod["subdomain"] == name and pod["restartPolicy"] == restart
        assert job["template"]["metadata"]["labels"]["dtfg/run"] == name
        (c,) = pod["containers"]
        assert c["command"] == ["python", "/app/deploy/entrypoint.py", "--log_dir",
                                "/logs/" + name, "--steps", "5000"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["DTFG_ROLE"] == role and env["DTFG_EXAMPLE"] == example
        assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert c["volumeMounts"] == [{"name": "logs", "mountPath": "/logs"}]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "logs"
    assert_only_the_runs_pods_get_in(docs["NetworkPolicy"], name)


def assert_only_the_runs_pods_get_in(policy, name):
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"dtfg/run": name}}
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"dtfg/run": name}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2222}]


# --- TF_CONFIG: what each pod gets, and what train.py makes of it --------------------------------
@pytest.mark.parametrize("role,index", [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1),
                                        ("worker", 2)])
def test_the_entrypoint_gives_each_pod_a_tf_config_naming_its_peers(role, index, monkeypatch):
    docs = generate("Hogwild", "--kind", "plain", "--image", "img", "--ps", "2",
                    "--workers", "3", "--namespace", "ml")
    env = {e["name"]: e["value"] for e in
           docs["Job/hogwild-%s" % role]["spec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    env.update(JOB_COMPLETION_INDEX=str(index), POD_NAMESPACE="ml")
    cluster, job, task = resolve(json.loads(entrypoint.tf_config(env)), monkeypatch)
    assert (job, task) == (role, index)
    assert cluster == {"ps": ["hogwild-ps-0.hogwild.ml.svc:2222", "hogwild-ps-1.hogwild.ml.svc:2222"],
                       "worker": ["hogwild-worker-%d.hogwild.ml.svc:2222" % i for i in range(3)]}


@pytest.mark.parametrize("task_type,index", [("ps", 0), ("worker", 0), ("worker", 1)])
def test_train_py_accepts_the_tf_config_a_tfjob_pod_gets(task_type, index, monkeypatch):
    config = manifests.tfjob_tf_config("dp", "ml", 1, 2, task_type, index)
    assert config["environment"] == "cloud"
    cluster, job, task = resolve(config, monkeypatch)
    assert (job, task) == (task_type, index)
    assert cluster["worker"] == ["dp-worker-0.ml.svc:2222", "dp-worker-1.ml.svc:2222"]


def test_the_entrypoint_without_its_environment_says_what_is_missing():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTFG_")}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "entrypoint.py")],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert error_lines(out.stderr) == ["error: entrypoint: 'DTFG_NAME' is missing or not a "
                                       "number: set it in the manifest"]


# --- The image (no container engine here: checked as text) ---------------------------------------
def test_the_image_installs_what_ci_installs_and_runs_the_entrypoint():
    with open(DOCKERFILE) as f:
        lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert lines[0] == "FROM python:3.11-slim"  # the Python the project is tested on
    assert "pip install -r requirements.txt" in ci
    assert "RUN pip install --no-cache-dir -r requirements.txt" in lines
    assert lines.index("COPY requirements.txt .") < lines.index(
        "RUN pip install --no-cache-dir -r requirements.txt") < lines.index("COPY . .")
    assert lines[-1] == 'CMD ["python", "deploy/entrypoint.py"]'
    # the paths the manifests use exist in the image: the repository is copied to /app
    assert "WORKDIR /app" in lines and os.path.isfile(os.path.join(ROOT, "deploy", "entrypoint.py"))


# --- A run with each pod's own host names and TF_CONFIG (network namespaces) ---------------------
@pytest.mark.cluster
@pytest.mark.skipif(missing_for_namespaces() is not None, reason=missing_for_namespaces() or "")
@pytest.mark.parametrize("deployment", ["tfjob", "plain"])
def test_downpour_trains_as_its_pods_would_and_leaves_nothing(deployment, tmp_path):
    proc = start_tool(["DOWNPOUR", "--deployment", deployment, "--timeout", "240",
                       "--log_dir", str(tmp_path / "logs")])
    try:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-3000:]
        name_of = {"tfjob": "downpour-worker-1.default.svc:2222",
                   "plain": "downpour-worker-1.downpour.default.svc:2222"}[deployment]
        assert "started worker1 pid=" in output and ("at %s" % name_of) in output
        assert float(summary_of(output, "worker0")["test_accuracy"]) >= ACCURACY_BAR
        if deployment == "plain":
            assert "[worker1] [entrypoint] TF_CONFIG=" in output
        left = [d for d in os.listdir("/etc/netns") if d.startswith("dtfg%d-" % proc.pid)] \
            if os.path.isdir("/etc/netns") else []
        assert not left, "hosts files left behind: %s" % left
    finally:
        assert_run_left_nothing(proc, tmp_path)
