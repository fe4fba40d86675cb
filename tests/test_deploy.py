"""deploy/: the manifests, the plain-Kubernetes entrypoint and the image, short of a cluster
(none is reachable here); and one run per kind where every task gets exactly the host names
and TF_CONFIG its pod would get (marked `cluster`: it makes network namespaces)."""
import fnmatch
import json
import os
import subprocess
import sys

import jsonschema
import pytest
import yaml

from conftest import (ACCURACY_BAR, DISTRIBUTED_EXAMPLES, EXAMPLES, ROOT, error_lines,
                      load_train_module)
from test_cluster import (assert_run_left_nothing, missing_for_namespaces, start_tool,
                          summary_of)

sys.path.insert(0, os.path.join(ROOT, "deploy"))
import entrypoint  # noqa: E402  (deploy/ is not a package)
import manifests  # noqa: E402

DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
DEPLOYABLE = [example for example, jobs in manifests.examples().items() if jobs]
TF2_STRATEGIES = [e for e in DEPLOYABLE if e not in DISTRIBUTED_EXAMPLES]  # tf2_cluster's jobs


def generate(*argv):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py")]
                         + list(argv), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {d["kind"] + ("/" + d["metadata"]["name"] if d["kind"] == "Job" else ""): d
            for d in yaml.safe_load_all(out.stdout)}


def resolve(tf_config, monkeypatch, example="Distributed-Setup"):
    """What an example's train.py makes of a TF_CONFIG: (cluster, job, index)."""
    module = load_train_module(example)
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    args = module.parse_flags([], module.example_flags)
    if example in DISTRIBUTED_EXAMPLES:
        cluster = module.resolve_cluster(args)
    elif hasattr(module, "resolve_workers"):  # one client drives the workers (no ps)
        cluster = module.resolve_workers(args)
    else:
        cluster = module.tf2_cluster(args, manifests.examples()[example])
    return cluster, args.job_name, args.task_index


def closed(schema):
    """The schema with every object that lists its properties closed to others: kubectl apply
    validates strictly and rejects a field the resource does not define. (A pod-template field
    that the extract leaves out fails too: copy its schema in from the same CRD.)"""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    return schema


with open(os.path.join(ROOT, "tests", "tfjob-v1-schema.json")) as f:
    TFJOB_SCHEMA = closed(json.load(f))


# --- The manifests --------------------------------------------------------------------------------
def test_every_example_that_reads_tf_config_can_be_deployed_and_the_baseline_cannot():
    jobs = manifests.examples()
    assert sorted(jobs) == EXAMPLES  # a folder with train.py and run.sh, nothing hard-coded
    assert {e: jobs[e] for e in DISTRIBUTED_EXAMPLES} == {e: ("ps", "worker")
                                                          for e in DISTRIBUTED_EXAMPLES}
    assert jobs["ParameterServerStrategy"] == ("chief", "ps", "worker")  # the coordinator
    assert jobs["MultiWorkerMirroredStrategy"] == ("worker",)
    assert jobs["Non-Distributed-Setup"] == ()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py"),
                          "Non-Distributed-Setup", "--image", "x"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and len(error_lines(out.stderr)) == 1, out.stderr
    assert "trains in one process and reads no TF_CONFIG" in out.stderr and not out.stdout


@pytest.mark.parametrize("argv, message", [
    (["Nowhere"], "'Nowhere' is not an example folder; choose one of: ADAG,"),
    (["MultiWorkerMirroredStrategy", "--ps", "1"], "has no parameter servers: leave out --ps"),
    (["DOWNPOUR", "--workers", "0"], "--ps and --workers must be at least 1"),
    (["DOWNPOUR", "--name", "My_Run"], "--name 'My_Run': use at most 40 lowercase letters"),
])
def test_the_generator_refuses_bad_input_in_one_line(argv, message):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py")] + argv
                         + ["--image", "x"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and not out.stdout, out.stderr
    assert len(error_lines(out.stderr)) == 1 and message in out.stderr, out.stderr


@pytest.mark.parametrize("example", DEPLOYABLE)
def test_the_tfjob_fits_the_operators_schema_and_has_what_it_needs(example):
    jobs = manifests.examples()[example]
    argv = ["--ps", "2"] if "ps" in jobs else []
    docs = generate(example, "--image", "registry.test/dtfg:1", "--workers", "3",
                    "--volume_claim", "logs", *argv)
    job = docs["TFJob"]
    jsonschema.Draft4Validator(TFJOB_SCHEMA).validate(job)  # types, required and known fields
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["spec"]["successPolicy"] == "AllWorkers"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    replicas = job["spec"]["tfReplicaSpecs"]
    expected = {"Chief": (1, "Never"), "PS": (2, "Never"), "Worker": (3, "OnFailure")}
    assert sorted(replicas) == sorted(manifests.REPLICA_TYPE[j] for j in jobs)
    for kind, spec in replicas.items():
        assert (spec["replicas"], spec["restartPolicy"]) == expected[kind]
        assert spec["template"]["spec"]["restartPolicy"] == expected[kind][1]
        (c,) = spec["template"]["spec"]["containers"]
        assert c["name"] == "tensorflow"  # the operator writes TF_CONFIG only into this one
        assert c["image"] == "registry.test/dtfg:1"
        assert c["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert c["command"] == ["python", "/app/%s/train.py" % example, "--log_dir",
                                "/logs/" + example.lower().replace("_", "-")]
        assert "env" not in c  # TF_CONFIG comes from the operator
    assert_only_the_runs_pods_get_in(docs["NetworkPolicy"], job["metadata"]["name"])


def test_the_schema_check_catches_what_the_operator_would_refuse():
    job = generate("DOWNPOUR", "--image", "img")["TFJob"]
    validator = jsonschema.Draft4Validator(TFJOB_SCHEMA)
    assert validator.is_valid(job)
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    for broken in ({**worker, "replica": 2},  # a misspelt field: kubectl apply refuses it
                   {**worker, "replicas": "2"},  # a string where the operator wants an int32
                   {**worker, "template": {"spec": {"containers": [{"image": "img"}]}}}):
        assert not validator.is_valid(
            {**job, "spec": {**job["spec"], "tfReplicaSpecs": {"Worker": broken}}}), broken


@pytest.mark.parametrize("example", DEPLOYABLE)
def test_the_plain_manifest_is_a_headless_service_and_an_indexed_job_per_role(example):
    name, jobs = example.lower().replace("_", "-"), manifests.examples()[example]
    docs = generate(example, "--kind", "plain", "--image", "img", "--workers", "3",
                    "--volume_claim", "logs", "--", "--steps", "5000")
    assert sorted(docs) == sorted(["Service", "NetworkPolicy"] + ["Job/%s-%s" % (name, role)
                                                                 for role in jobs])
    service = docs["Service"]
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == name
    assert service["spec"]["selector"] == {"dtfg/run": name}
    assert service["spec"]["publishNotReadyAddresses"] is True
    counts = {"chief": 1, "ps": 1, "worker": 3}
    for role in jobs:
        restart = "OnFailure" if role == "worker" else "Never"
        job = docs["Job/%s-%s" % (name, role)]["spec"]
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == counts[role]
        assert job["backoffLimit"] == (3 if restart == "OnFailure" else 0)
        pod = job["template"]["spec"]
        assert pod["subdomain"] == name and pod["restartPolicy"] == restart
        assert job["template"]["metadata"]["labels"]["dtfg/run"] == name
        (c,) = pod["containers"]
        assert c["command"] == ["python", "/app/deploy/entrypoint.py", "--log_dir",
                                "/logs/" + name, "--steps", "5000"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["DTFG_ROLE"] == role and env["DTFG_EXAMPLE"] == example
        assert [env[variable] for _, variable in entrypoint.COUNTS] == [
            str(counts[j]) if j in jobs else "0" for j, _ in entrypoint.COUNTS]
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
def pods_of(example, argv):
    """Every pod of the plain manifest: (role, index, its environment from the manifest)."""
    docs = generate(example, "--kind", "plain", "--image", "img", "--namespace", "ml", *argv)
    for key, doc in docs.items():
        if key.startswith("Job/"):
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
            for index in range(doc["spec"]["completions"]):
                yield env["DTFG_ROLE"], index, dict(env, JOB_COMPLETION_INDEX=str(index),
                                                    POD_NAMESPACE="ml")


def test_the_entrypoint_gives_every_pod_a_tf_config_naming_its_peers(monkeypatch):
    pods = list(pods_of("Hogwild", ["--ps", "2", "--workers", "3"]))
    assert sorted((role, i) for role, i, _ in pods) == [("ps", 0), ("ps", 1), ("worker", 0),
                                                       ("worker", 1), ("worker", 2)]
    for role, index, env in pods:
        cluster, job, task = resolve(json.loads(entrypoint.tf_config(env)), monkeypatch)
        assert (job, task) == (role, index)
        assert cluster == {"ps": ["hogwild-ps-%d.hogwild.ml.svc:2222" % i for i in range(2)],
                           "worker": ["hogwild-worker-%d.hogwild.ml.svc:2222" % i
                                      for i in range(3)]}


@pytest.mark.parametrize("example", TF2_STRATEGIES)
def test_the_entrypoint_gives_tensorflow_2s_strategies_the_jobs_they_read(example, monkeypatch):
    name, jobs = example.lower().replace("_", "-"), manifests.examples()[example]
    pods = list(pods_of(example, ["--workers", "2"]))
    assert len(pods) == ("chief" in jobs) + ("ps" in jobs) + 2
    for role, index, env in pods:
        cluster, job, task = resolve(json.loads(entrypoint.tf_config(env)), monkeypatch, example)
        assert (job, task) == (role, index)
        assert sorted(cluster) == sorted(jobs)  # no empty ps job for a strategy without one
        assert cluster["worker"] == ["%s-worker-%d.%s.ml.svc:2222" % (name, i, name)
                                     for i in range(2)]


@pytest.mark.parametrize("example", ["Distributed-Setup"] + TF2_STRATEGIES)
def test_train_py_accepts_the_tf_config_every_tfjob_pod_gets(example, monkeypatch):
    counts = {job: 2 if job == "worker" else 1 for job in manifests.examples()[example]}
    for task_type, n in counts.items():
        for index in range(n):
            config = manifests.tfjob_tf_config("dp", "ml", counts, task_type, index)
            assert config["environment"] == "cloud"
            cluster, job, task = resolve(config, monkeypatch, example)
            assert (job, task) == (task_type, index)
            assert cluster["worker"] == ["dp-worker-0.ml.svc:2222", "dp-worker-1.ml.svc:2222"]


# Vertex AI: workerPoolSpecs 0-3 become chief, worker, ps and evaluator; the task may carry a
# hyperparameter-tuning "trial", and a "job" key holds the job's own spec. SageMaker's
# parameter-server distribution: the first host is the "master", every host also runs a ps on
# port 2223, and a single host has no "worker" key at all.
VERTEX = {"cluster": {"chief": ["cmle-training-workerpool0-ab-0:2222"],
                      "worker": ["cmle-training-workerpool1-ab-0:2222",
                                 "cmle-training-workerpool1-ab-1:2222"],
                      "ps": ["cmle-training-workerpool2-ab-0:2222"],
                      "evaluator": ["cmle-training-workerpool3-ab-0:2222"]},
          "environment": "cloud", "job": {"worker_pool_specs": [{"machine_spec": {}}]}}
SAGEMAKER_ONE_HOST = {"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223"]},
                      "environment": "cloud"}


@pytest.mark.parametrize("config, task, expected", [
    (VERTEX, {"type": "chief", "index": 0, "trial": ""}, ("worker", 0)),
    (VERTEX, {"type": "worker", "index": 1, "trial": "3"}, ("worker", 2)),
    (VERTEX, {"type": "ps", "index": 0, "trial": ""}, ("ps", 0)),
    (SAGEMAKER_ONE_HOST, {"type": "master", "index": 0}, ("worker", 0)),
    (SAGEMAKER_ONE_HOST, {"type": "ps", "index": 0}, ("ps", 0)),
])
def test_train_py_accepts_vertex_ai_and_sagemaker_tf_config(config, task, expected, monkeypatch):
    cluster, job, index = resolve(dict(config, task=task), monkeypatch)
    assert (job, index) == expected
    chief = config["cluster"].get("chief", config["cluster"].get("master"))
    assert cluster == {"ps": config["cluster"]["ps"],
                       "worker": chief + config["cluster"].get("worker", [])}  # no evaluator


@pytest.mark.parametrize("unset, message", [
    ("DTFG_NAME", "'DTFG_NAME' is not set: the manifest sets it"),
    ("JOB_COMPLETION_INDEX", "'JOB_COMPLETION_INDEX' is not set: the manifest sets it"),
    ("DTFG_NUM_PS=two", "a count or index is not a whole number"),
])
def test_the_entrypoint_without_its_environment_says_what_is_missing(unset, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTFG_")}
    env.update(DTFG_EXAMPLE="DOWNPOUR", DTFG_NAME="dp", DTFG_ROLE="worker", DTFG_NUM_CHIEF="0",
               DTFG_NUM_PS="1", DTFG_NUM_WORKERS="2", JOB_COMPLETION_INDEX="0")
    variable, _, value = unset.partition("=")
    env.pop(variable) if not value else env.update({variable: value})
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "entrypoint.py")],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and not out.stdout, out.stderr
    (line,) = error_lines(out.stderr)
    assert line.startswith("error: entrypoint: " + message), line


# --- The image (no container engine runs here: checked as text) ---------------------------------
def test_the_image_installs_what_ci_installs_and_runs_the_entrypoint():
    with open(DOCKERFILE) as f:
        lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [l.strip() for l in f if l.strip().startswith("pip ")]
    assert ci == ["pip install -r requirements.txt"]  # CI installs this one file, nothing else
    assert lines[0] == "FROM python:3.11-slim"  # the Python the project is tested on
    assert [l for l in lines if "pip " in l] == [
        "RUN pip install --no-cache-dir -r requirements.txt"]
    assert lines.index("COPY requirements.txt .") < lines.index(
        "RUN pip install --no-cache-dir -r requirements.txt") < lines.index("COPY . .")
    assert "WORKDIR /app" in lines  # the manifests run /app/<example>/train.py
    assert lines[-1] == 'CMD ["python", "deploy/entrypoint.py"]'


def test_the_build_context_keeps_every_example_and_the_entrypoint():
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    needed = ["requirements.txt", "deploy/entrypoint.py"] + [
        "%s/%s" % (example, name) for example in DEPLOYABLE for name in ("train.py", "run.sh")]
    for path in needed:
        assert not any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/")
                       for pattern in ignored), path
    assert {"*/logs", ".git"} <= set(ignored)  # old runs' checkpoints do not go into the image


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


@pytest.mark.parametrize("kind", ["tfjob", "plain"])
def test_each_pod_is_described_as_its_manifest_runs_it(kind):
    """--pods (what benchmarks/cluster.py runs): every pod of the run, its host the one its own
    TF_CONFIG names for it, with the operator's TF_CONFIG or the entrypoint's environment."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "manifests.py"),
                          "ParameterServerStrategy", "--kind", kind, "--image", "x",
                          "--workers", "3", "--pods"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    pods = json.loads(out.stdout)
    assert sorted((p["job"], p["index"]) for p in pods) == [
        ("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    for pod in pods:
        config = json.loads(pod["env"]["TF_CONFIG"] if kind == "tfjob" else
                            entrypoint.tf_config(pod["env"]))
        assert config["task"] == {"type": pod["job"], "index": pod["index"]}
        own = config["cluster"][pod["job"]][pod["index"]]
        assert own == "%s:%d" % (pod["host"], entrypoint.PORT)
        program = "ParameterServerStrategy/train.py" if kind == "tfjob" else "deploy/entrypoint.py"
        assert pod["program"] == program
