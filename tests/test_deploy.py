"""deploy/: the manifests, the plain-Kubernetes entrypoint and the image, short of a cluster
(none is reachable here); and one run per kind where every task gets exactly the host names
and TF_CONFIG its pod would get (marked `cluster`: it makes network namespaces)."""
import ast
import contextlib
import fnmatch
import functools
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from support.examples import (ACCURACY_BAR, DISTRIBUTED_EXAMPLES, EXAMPLES, ROOT, error_lines,
                              load_train_module)
from support.namespaces import assert_run_left_nothing, missing_for_namespaces, start_tool
from support.runs import summary_of

sys.path.insert(0, os.path.join(ROOT, "deploy"))
import entrypoint  # noqa: E402  (deploy/ is not a package)
import manifests  # noqa: E402

# the generator reads every train.py's JOBS each time it runs; here it runs hundreds of times
manifests.examples = functools.lru_cache(maxsize=None)(manifests.examples)

DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
DEPLOYABLE = [example for example, jobs in manifests.examples().items() if jobs]
TF2_STRATEGIES = [e for e in DEPLOYABLE if e not in DISTRIBUTED_EXAMPLES]  # tf2_cluster's jobs


def generate(*argv):
    """The manifest's documents by kind (a Job by kind/name), read back from the YAML written."""
    return {d["kind"] + ("/" + d["metadata"]["name"] if d["kind"] == "Job" else ""): d
            for d in documents(*argv)}


def documents(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # in this process: the manifests use no TensorFlow
        assert manifests.main(list(argv)) == 0
    return list(yaml.safe_load_all(out.getvalue()))


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

# The Kubernetes versions whose API schemas kubernetes-validate ships, from 1.25 (it has each
# twice: with and without its strict variant). The manifests target 1.29 unless told otherwise.
KUBERNETES_VERSIONS = sorted({tuple(int(n) for n in v.split(".")[:2])
                              for v in kubernetes_validate.utils.all_versions()})
# validate() reads a 1.2 MB schema file on every call: read each once
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents)




def pod_templates(doc):
    if doc["kind"] == "TFJob":
        return [spec["template"] for spec in doc["spec"]["tfReplicaSpecs"].values()]
    return [doc["spec"]["template"]] if doc["kind"] == "Job" else []


def core_objects(doc):
    """What kubernetes-validate can check: the core objects themselves, and of a TFJob (a custom
    resource, checked against the operator's schema instead) its pod templates, as PodTemplates."""
    if doc["kind"] != "TFJob":
        return [doc]
    return [{"apiVersion": "v1", "kind": "PodTemplate",
             "metadata": {"name": "%s-%s" % (doc["metadata"]["name"], kind.lower())},
             "template": spec["template"]}
            for kind, spec in doc["spec"]["tfReplicaSpecs"].items()]


# What the "restricted" Pod Security Standard admits (it includes the baseline standard's rules)
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def refused_by_the_restricted_standard(pod):
    """Why a namespace labelled pod-security.kubernetes.io/enforce=restricted would refuse the
    pod spec: a list of reasons, empty if none."""
    reasons = [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    pod_context = pod.get("securityContext", {})
    if pod_context.get("runAsUser") == 0:
        reasons.append("the pod runs as root")
    reasons += ["volume %s: %s" % (v["name"], sorted(set(v) - {"name"}))
                for v in pod.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in pod["containers"] + pod.get("initContainers", []):
        context = c.get("securityContext", {})
        capabilities = context.get("capabilities", {})
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        checks = {
            "privileged": context.get("privileged", False) is False,
            "allowPrivilegeEscalation is not false": context.get(
                "allowPrivilegeEscalation") is False,
            "capabilities: not drop ALL": "ALL" in capabilities.get("drop", []),
            "capabilities: adds more than NET_BIND_SERVICE": set(
                capabilities.get("add", [])) <= {"NET_BIND_SERVICE"},
            "runAsNonRoot is not true": context.get(
                "runAsNonRoot", pod_context.get("runAsNonRoot")) is True,
            "runs as root": context.get("runAsUser", pod_context.get("runAsUser")) != 0,
            "no seccompProfile RuntimeDefault or Localhost": seccomp.get("type") in (
                "RuntimeDefault", "Localhost"),
            "a hostPort": not any(port.get("hostPort") for port in c.get("ports", [])),
        }
        reasons += ["container %s: %s" % (c["name"], why) for why, ok in checks.items() if not ok]
    return reasons


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
    (["DOWNPOUR", "--name", "My_Run"], "--name 'My_Run': start with a lowercase letter"),
    (["DOWNPOUR", "--name", "9run"], "--name '9run': start with a lowercase letter"),
    (["DOWNPOUR", "--name", "run-"], "and end with a letter or digit"),
    (["DOWNPOUR", "--name", "r" * 41], "at most 39 lowercase letters"),
    (["DOWNPOUR", "--memory", "2"], "--memory '2': a Kubernetes quantity with its unit"),
    (["DOWNPOUR", "--memory", "2GB"], "--memory '2GB': a Kubernetes quantity with its unit"),
    (["DOWNPOUR", "--gpus", "-1"], "--gpus must be 0 or more"),
    (["DOWNPOUR", "--restarts", "-1"], "--restarts must be 0 or more"),
    (["DOWNPOUR", "--ttl", "-5"], "--ttl must be 0 or more"),
    (["DOWNPOUR", "--kubernetes", "1.24"], "--kubernetes '1.24': give the cluster's version"),
    (["DOWNPOUR", "--kubernetes", "latest"], "--kubernetes 'latest': give the cluster's version"),
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
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running",
                                        "backoffLimit": 9,  # 3 workers, 3 restarts each
                                        "ttlSecondsAfterFinished": 86400}
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
        assert c["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"},
                                  "limits": {"memory": "2Gi"}}
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
        job = docs["Job/%s-%s" % (name, role)]["spec"]
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == counts[role]
        if role == "worker":  # a new pod for a worker that failed, 3 times per worker
            assert job["backoffLimitPerIndex"] == 3 and "backoffLimit" not in job
        else:  # a ps or a coordinator that fails ends the run
            assert job["backoffLimit"] == 0 and "backoffLimitPerIndex" not in job
        assert job["podReplacementPolicy"] == "Failed"
        assert job["ttlSecondsAfterFinished"] == 86400
        pod = job["template"]["spec"]
        assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
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


def test_plain_jobs_for_clusters_before_1_29_count_the_restarts_over_all_workers():
    """Before 1.29 a Job's restarts can only be counted over all its pods; the workers then
    restart in their pod (OnFailure), and the Job may restart 3 times per worker in all."""
    for version in ("1.28", "v1.25.4"):
        docs = generate("Sync-SGD", "--kind", "plain", "--image", "img", "--workers", "4",
                        "--kubernetes", version)
        for role in ("ps", "worker"):
            job = docs["Job/sync-sgd-" + role]["spec"]
            assert job["backoffLimit"] == {"ps": 0, "worker": 12}[role]
            assert job["template"]["spec"]["restartPolicy"] == manifests.RESTART[role]
            assert not {"backoffLimitPerIndex", "podReplacementPolicy"} & set(job), job


@pytest.mark.parametrize("kind", ["tfjob", "plain"])
def test_every_object_carries_the_runs_labels_and_every_pod_opts_out_of_sidecars(kind):
    """kubectl get tfjob,job,service,networkpolicy,pod -l dtfg/run=NAME lists the whole run."""
    docs = documents("ParameterServerStrategy", "--kind", kind, "--image", "img", "--name", "r1")
    for doc in docs:
        assert {"app.kubernetes.io/part-of": "dtfg", "dtfg/run": "r1"}.items() <= \
            doc["metadata"]["labels"].items(), doc["kind"]
        for template in pod_templates(doc):
            assert template["metadata"]["labels"]["dtfg/run"] == "r1"
            assert template["metadata"]["labels"]["dtfg/role"] in manifests.JOBS
            # an Istio sidecar never exits: its pod, and so its Job, would never complete
            assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
            assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert sum(len(pod_templates(doc)) for doc in docs) == 3  # chief, ps, worker: each one


@pytest.mark.parametrize("kind", ["tfjob", "plain"])
def test_the_pods_run_as_the_restricted_pod_security_standard_asks(kind):
    docs = documents("DOWNPOUR", "--kind", kind, "--image", "img", "--volume_claim", "logs")
    for template in [t for doc in docs for t in pod_templates(doc)]:
        assert refused_by_the_restricted_standard(template["spec"]) == []
        # the image's user (a number, or the kubelet cannot tell that it is not root)
        assert template["spec"]["securityContext"]["runAsUser"] == manifests.USER


def test_the_restricted_check_finds_what_the_standard_refuses():
    pod = generate("DOWNPOUR", "--image", "img")["TFJob"]["spec"]["tfReplicaSpecs"]["PS"][
        "template"]["spec"]
    assert refused_by_the_restricted_standard(pod) == []
    (c,) = pod["containers"]
    as_root = {**pod, "securityContext": {"runAsUser": 0}, "hostNetwork": True,
               "containers": [{"name": "tensorflow", "image": "img",
                               "ports": [{"containerPort": 2222, "hostPort": 2222}]}],
               "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
    assert refused_by_the_restricted_standard(as_root) == [
        "hostNetwork", "the pod runs as root", "volume host: ['hostPath']",
        "container tensorflow: allowPrivilegeEscalation is not false",
        "container tensorflow: capabilities: not drop ALL",
        "container tensorflow: runAsNonRoot is not true",
        "container tensorflow: runs as root",
        "container tensorflow: no seccompProfile RuntimeDefault or Localhost",
        "container tensorflow: a hostPort"]
    privileged = {**c, "securityContext": {**c["securityContext"], "privileged": True,
                                           "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}
    assert refused_by_the_restricted_standard({**pod, "containers": [privileged]}) == [
        "container tensorflow: privileged",
        "container tensorflow: capabilities: adds more than NET_BIND_SERVICE"]


@pytest.mark.parametrize("kind", ["tfjob", "plain"])
def test_memory_gpus_and_the_log_directory_are_as_asked(kind):
    docs = documents("ParameterServerStrategy", "--kind", kind, "--image", "img", "--memory",
                     "1500Mi", "--gpus", "2", "--ttl", "600")
    for doc in docs:
        for template in pod_templates(doc):
            role = template["metadata"]["labels"]["dtfg/role"]
            (c,) = template["spec"]["containers"]
            limits = {"memory": "1500Mi", "nvidia.com/gpu": 2} if role == "worker" else {
                "memory": "1500Mi"}  # the workers compute; the ps and the coordinator do not
            assert c["resources"] == {"requests": {"cpu": "1", "memory": "1500Mi"},
                                      "limits": limits}
            # without a volume claim, a directory of the pod's own, where its user may write
            assert template["spec"]["volumes"] == [{"name": "logs", "emptyDir": {}}]
            assert c["volumeMounts"] == [{"name": "logs", "mountPath": "/logs"}]
            assert c["command"][-2:] == ["--log_dir", "/logs/parameterserverstrategy"]
        if doc["kind"] == "TFJob":  # the operator deletes it 600 s after it has finished
            assert doc["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 600
        elif doc["kind"] == "Job":  # as Kubernetes does a Job, and its pods with it
            assert doc["spec"]["ttlSecondsAfterFinished"] == 600


def manifest_options(example):
    """The option sets whose manifests are validated: the defaults, most options at once, and
    a cluster older than 1.29 (the plain Jobs count their restarts differently there)."""
    ps = ["--ps", "2"] if "ps" in manifests.examples()[example] else []
    return [[], ["--workers", "3", "--volume_claim", "logs", "--gpus", "1", "--memory", "1500Mi",
                 "--ttl", "0", "--restarts", "0", "--name", "run-2", "--namespace", "ml", *ps,
                 "--", "--steps", "100"],
            ["--kubernetes", "1.25", "--restarts", "5"]]


@pytest.mark.parametrize("kind", ["tfjob", "plain"])
@pytest.mark.parametrize("example", DEPLOYABLE)
def test_every_manifest_passes_strict_validation_for_each_kubernetes_version(example, kind):
    """Every object of the manifest, against the API schemas of every Kubernetes version it is
    meant for (1.29 on by default, 1.25 on with --kubernetes 1.25), closed to unknown fields as
    kubectl apply checks by default; the TFJob against the operator's CRD."""
    for options in manifest_options(example):
        oldest = (1, 25) if "--kubernetes" in options else (1, 29)
        versions = [v for v in KUBERNETES_VERSIONS if v >= oldest]
        assert versions[0] == oldest and versions[-1] >= (1, 37)
        for doc in documents(example, "--kind", kind, "--image", "registry.test/dtfg:1",
                             *options):
            if doc["kind"] == "TFJob":
                jsonschema.Draft4Validator(TFJOB_SCHEMA).validate(doc)
            for core in core_objects(doc):
                for version in versions:
                    kubernetes_validate.validate(core, "%d.%d" % version, strict=True)
            if doc["kind"] == "Job":
                assert_the_job_controller_accepts(doc["spec"])


def assert_the_job_controller_accepts(job):
    """The rules a Job's spec must follow that no schema states (the API server checks them)."""
    restart = job["template"]["spec"]["restartPolicy"]
    assert restart in ("Never", "OnFailure")
    if "backoffLimitPerIndex" in job:
        assert job["completionMode"] == "Indexed" and restart == "Never"
    assert job["parallelism"] <= job["completions"]


def test_strict_validation_refuses_what_the_api_server_would():
    job = generate("DOWNPOUR", "--kind", "plain", "--image", "img")["Job/downpour-worker"]
    spec = job["spec"]
    # a 1.27 API server does not know the per-index limits: hence --kubernetes for old clusters
    with pytest.raises(kubernetes_validate.ValidationError, match="backoffLimitPerIndex"):
        kubernetes_validate.validate(job, "1.27", strict=True)
    for version in [v for v in KUBERNETES_VERSIONS if v >= (1, 29)]:
        kubernetes_validate.validate(job, "%d.%d" % version, strict=True)
        for broken in ({**spec, "backofLimit": 3},  # a misspelt field
                       {**spec, "completions": "2"},  # a string where Kubernetes wants a number
                       {**spec, "template": {**spec["template"], "spec": {
                           **spec["template"]["spec"], "securityContext": {"runAsUser": "x"}}}}):
            with pytest.raises(kubernetes_validate.ValidationError):
                kubernetes_validate.validate({**job, "spec": broken}, "%d.%d" % version,
                                             strict=True)


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
def requirement_lines(path):
    """A requirements file's requirements, without comments."""
    with open(os.path.join(ROOT, path)) as f:
        return [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]


def distribution(requirement):
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def test_the_image_installs_what_train_py_needs_at_the_versions_of_requirements_txt():
    everything = requirement_lines("requirements.txt")
    image = requirement_lines("deploy/requirements.txt")
    assert set(image) < set(everything)  # the same versions; pytest, jupyter... are left out
    assert not {"pytest", "jupyter", "matplotlib", "kubernetes-validate"} & {
        distribution(r) for r in image}
    tensorflow = [r for r in image if distribution(r) == "tensorflow"]
    assert requirement_lines("deploy/requirements-gpu.txt") == [
        "-r requirements.txt", tensorflow[0].replace("tensorflow", "tensorflow[and-cuda]", 1)]
    # every package that a train.py or the entrypoint imports is in the image
    provides = importlib.metadata.packages_distributions()
    imported = set()
    for path in [os.path.join(e, "train.py") for e in DEPLOYABLE] + ["deploy/entrypoint.py"]:
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read())
        imported |= {alias.name.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.level == 0}
    installed = {distribution(r) for r in image}
    for module in sorted(imported - set(sys.stdlib_module_names)):
        assert {d.lower().replace("_", "-") for d in provides.get(module, [module])} & installed, (
            module)


def test_the_image_runs_as_a_user_of_its_own_and_the_entrypoint():
    with open(DOCKERFILE) as f:
        lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [l.strip() for l in f if l.strip().startswith("pip ")]
    assert ci == ["pip install -r requirements.txt"]  # users and CI: this one file, nothing else
    assert lines[0] == "FROM python:3.11-slim"  # the Python the project is tested on
    install = 'RUN pip install --no-cache-dir -r "$REQUIREMENTS"'
    assert [l for l in lines if "pip " in l] == [install]  # not the top-level requirements.txt
    assert lines.index("ARG REQUIREMENTS=deploy/requirements.txt") < lines.index(
        "COPY deploy/requirements.txt deploy/requirements-gpu.txt deploy/") < lines.index(
        install) < lines.index("COPY . .")
    assert "WORKDIR /app" in lines  # the manifests run /app/<example>/train.py
    # a numeric user, the one the pods name: the kubelet can then tell that it is not root
    assert lines[-2] == "USER %d" % manifests.USER
    assert "useradd --uid %d --gid %d" % (manifests.USER, manifests.USER) in lines[-3]
    assert lines[-1] == 'CMD ["python", "deploy/entrypoint.py"]'


def test_the_build_context_keeps_every_example_and_the_entrypoint():
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    needed = ["deploy/requirements.txt", "deploy/requirements-gpu.txt",
              "deploy/entrypoint.py"] + [
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
