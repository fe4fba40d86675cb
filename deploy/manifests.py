"""Kubernetes manifests for any example, with the Kubeflow operator (TFJob) or without (plain).

    python deploy/manifests.py DOWNPOUR --image REGISTRY/dtfg:1 > downpour.yaml
    python deploy/manifests.py Sync-SGD --kind plain --workers 3 --image REGISTRY/dtfg:1 \\
        --volume_claim training-logs -- --steps 20000 > sync.yaml
    kubectl apply -f downpour.yaml

--kind tfjob: one TFJob (kubeflow.org/v1) with PS and Worker replicas, and a Chief for an example
with a coordinator (an example without parameter servers has no PS); the operator writes each
pod's TF_CONFIG (<name>-<type>-<i>.<namespace>.svc:2222) and, with successPolicy AllWorkers,
ends the job when every worker is done. --kind plain: a headless Service and an Indexed Job per
role (ps, worker; chief) that run deploy/entrypoint.py, which builds TF_CONFIG itself. Both add a
NetworkPolicy: the TensorFlow servers have no authentication, so only the run's own pods may
reach their port. Arguments after -- go to every train.py, after --log_dir /logs/<name>: /logs
is a directory of the pod's own (emptyDir), or with --volume_claim a PersistentVolumeClaim, so
that checkpoints outlive a pod and a restarted chief resumes from them (recommended for
MultiWorkerMirroredStrategy, whose every worker starts from worker 0's checkpoint).

Every object carries the labels app.kubernetes.io/part-of=dtfg and dtfg/run=<name> (the pods
also dtfg/role), so `kubectl get tfjob,service,networkpolicy,pod -l dtfg/run=<name>` (job for
tfjob with --kind plain) lists the whole run. The pods run as user 1000 (the image's), with
the securityContext that the "restricted" Pod Security Standard asks for, and opt out of
Istio's sidecar, which never exits and would keep a Job from completing.
"""
import argparse
import ast
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import entrypoint  # noqa: E402  (deploy/ is not a package; the entrypoint names the hosts)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = entrypoint.PORT
JOBS = ("chief", "ps", "worker")  # TF_CONFIG's job names, in the order the manifests list them


def examples():
    """Every example (a folder with a train.py and a run.sh) and the jobs its TF_CONFIG names."""
    found = {}
    for d in sorted(os.listdir(ROOT)):
        train_py = os.path.join(ROOT, d, "train.py")
        if os.path.isfile(train_py) and os.path.isfile(os.path.join(ROOT, d, "run.sh")):
            found[d] = declared_jobs(train_py) or ()
    return found


def declared_jobs(train_py):
    """The jobs a train.py declares in its JOBS constant, in the manifests' order: ps and
    worker for the parameter-server examples (their chief is worker 0), the jobs TensorFlow 2's
    strategies need (a chief for the coordinator, or workers only), () for one process; None
    where it declares no JOBS. The one reader of JOBS: benchmarks/cluster.py and the tests'
    sync_shared.py import it from here."""
    with open(train_py) as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
                    "JOBS"]:
                return tuple(job for job in JOBS if job in ast.literal_eval(node.value))
    return None


USER = 1000  # the image's user (deploy/Dockerfile); a number, so runAsNonRoot can be checked


def container(args, role, command, env=()):
    resources = {"requests": {"cpu": "1", "memory": args.memory},
                 "limits": {"memory": args.memory}}  # killed over it, not its node starved
    if role == "worker" and args.gpus:  # the workers compute; a ps or coordinator does not
        resources["limits"]["nvidia.com/gpu"] = args.gpus
    c = {"name": "tensorflow",  # TFJob writes TF_CONFIG only into a container of this name
         "image": args.image, "command": command,
         "ports": [{"name": "tfjob-port", "containerPort": PORT}],
         "resources": resources,
         # with the pod's runAsNonRoot and seccompProfile: what the "restricted" standard asks
         "securityContext": {"allowPrivilegeEscalation": False,
                             "capabilities": {"drop": ["ALL"]}}}
    if env:
        c["env"] = list(env)
    c["volumeMounts"] = [{"name": "logs", "mountPath": "/logs"}]
    return c


def pod_spec(args, role, command, restart, env=(), subdomain=None):
    spec = {"restartPolicy": restart,
            "securityContext": {"runAsNonRoot": True, "runAsUser": USER, "runAsGroup": USER,
                                "fsGroup": USER,  # a volume that supports it becomes writable
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container(args, role, command, env)]}
    if subdomain:
        spec["subdomain"] = subdomain
    if args.volume_claim:
        spec["volumes"] = [{"name": "logs",
                            "persistentVolumeClaim": {"claimName": args.volume_claim}}]
    else:  # the pod's own: kept while its container restarts, gone with the pod (then a chief,
        # or MultiWorkerMirroredStrategy's worker 0, whose values every worker takes, starts over)
        spec["volumes"] = [{"name": "logs", "emptyDir": {}}]
    return spec


def pod_metadata(args, role):
    # Istio's sidecar never exits, so a Job whose pods have one never completes. The annotation
    # is what the Kubeflow docs ask for; newer Istio reads the label (and prefers it).
    no_sidecar = {"sidecar.istio.io/inject": "false"}
    return {"labels": dict(labels(args, role), **no_sidecar), "annotations": no_sidecar}


def train_args(args):
    return ["--log_dir", "/logs/" + args.name] + args.train_args


def labels(args, role=None):
    found = {"app.kubernetes.io/part-of": "dtfg", "dtfg/run": args.name}
    if role:
        found["dtfg/role"] = role
    return found


def metadata(args, name, role=None):
    return {"name": name, "namespace": args.namespace, "labels": labels(args, role)}


def network_policy(args):
    """Only the run's own pods may reach the TensorFlow port of its pods."""
    run = {"matchLabels": {"dtfg/run": args.name}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(args, args.name + "-only-its-own-pods"),
            "spec": {"podSelector": run, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": run}],
                                  "ports": [{"protocol": "TCP", "port": PORT}]}]}}


# A ps that restarts has lost the parameters, so it does not restart (the run fails and is
# started again, resuming from the last checkpoint); a worker that restarts rejoins the run.
# ParameterServerStrategy's chief (the coordinator) does not restart either: once it is gone its
# servers end, so a new one would find nobody to drive.
RESTART = {"chief": "Never", "ps": "Never", "worker": "OnFailure"}
REPLICA_TYPE = {"chief": "Chief", "ps": "PS", "worker": "Worker"}  # TFJob's names of the jobs


def tfjob(args):
    command = ["python", "/app/%s/train.py" % args.example] + train_args(args)
    replica = lambda role, n: {
        "replicas": n, "restartPolicy": RESTART[role],
        "template": {"metadata": pod_metadata(args, role),
                     "spec": pod_spec(args, role, command, RESTART[role])}}
    # backoffLimit counts the restarts of every pod of the TFJob together (only the workers
    # restart), so the budget is --restarts for each worker on average: one worker may use it
    # all. MultiWorkerMirroredStrategy's workers all restart when one is lost: one per worker.
    run_policy = {"cleanPodPolicy": "Running",
                  "backoffLimit": args.restarts * args.counts["worker"],
                  "ttlSecondsAfterFinished": args.ttl}
    # AllWorkers: the job succeeds when every worker has (the default waits for worker 0 only).
    # With a Chief replica the operator goes by the chief instead, whatever this says.
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
           "metadata": metadata(args, args.name),
           "spec": {"runPolicy": run_policy,
                    "successPolicy": "AllWorkers",
                    "tfReplicaSpecs": {REPLICA_TYPE[role]: replica(role, n)
                                       for role, n in args.counts.items()}}}
    return [job, network_policy(args)]


def tfjob_tf_config(name, namespace, counts, task_type, index):
    """The TF_CONFIG the operator gives a TFJob pod (counts: job name to number of pods)."""
    host = lambda role, i: "%s-%s-%d.%s.svc:%d" % (name, role, i, namespace, PORT)
    return {"cluster": {role: [host(role, i) for i in range(n)] for role, n in counts.items()},
            "task": {"type": task_type, "index": index}, "environment": "cloud"}


def plain(args):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": metadata(args, args.name),
               "spec": {"clusterIP": "None",  # headless: one DNS name per pod
                        # a name as soon as the pod has an address, not once it is ready: the
                        # tasks look each other up while they start
                        "publishNotReadyAddresses": True,
                        "selector": {"dtfg/run": args.name},
                        "ports": [{"name": "tfjob-port", "port": PORT}]}}
    docs = [service, network_policy(args)]
    for role, n in args.counts.items():
        env = plain_env(args, role) + [{"name": "POD_NAMESPACE", "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.namespace"}}}]
        restart = RESTART[role]
        spec = {"completionMode": "Indexed", "completions": n, "parallelism": n}
        if role != "worker":
            spec["backoffLimit"] = 0  # one failure ends the Job (see RESTART)
        elif per_index_limits(args):
            # Each worker may fail --restarts times; a new pod, under the same name, replaces
            # one that failed. The restarts are counted per index only with restartPolicy Never.
            restart = "Never"
            spec["backoffLimitPerIndex"] = args.restarts
        else:  # counted over all the Job's pods: --restarts for each worker on average
            spec["backoffLimit"] = args.restarts * n
        if per_index_limits(args):
            # a new pod for an index only once the old one has stopped: two pods of one task
            # would both answer to its name
            spec["podReplacementPolicy"] = "Failed"
        spec["ttlSecondsAfterFinished"] = args.ttl
        spec["template"] = {"metadata": pod_metadata(args, role),
                            "spec": pod_spec(args, role, ["python", "/app/deploy/entrypoint.py"]
                                             + train_args(args), restart, env,
                                             subdomain=args.name)}
        docs.append({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": metadata(args, "%s-%s" % (args.name, role), role),
                     "spec": spec})
    return docs


# backoffLimitPerIndex and podReplacementPolicy are on by default from Kubernetes 1.29 (beta;
# generally available in 1.33 and 1.34); a 1.28 API server ignores them, an older one refuses
# them (tests/test_deploy.py shows 1.27's schema refusing them).
PER_INDEX_SINCE = (1, 29)


def per_index_limits(args):
    return args.kubernetes >= PER_INDEX_SINCE


def plain_env(args, role):
    """What deploy/entrypoint.py reads (JOB_COMPLETION_INDEX comes from Kubernetes)."""
    values = [("DTFG_EXAMPLE", args.example), ("DTFG_NAME", args.name), ("DTFG_ROLE", role)]
    values += [(variable, args.counts.get(job, 0)) for job, variable in entrypoint.COUNTS]
    return [{"name": k, "value": str(v)} for k, v in values]


def to_yaml(value, indent=0):
    """YAML for the dicts, lists, strings and numbers of a manifest (no dependency needed)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append("%s%s:\n%s" % (pad, k, to_yaml(v, indent + 2)))
            else:
                lines.append("%s%s: %s" % (pad, k, scalar(v)))
        return "\n".join(lines)
    lines = []
    for item in value:
        text = to_yaml(item, indent + 2) if isinstance(item, (dict, list)) else pad + "  " + \
            scalar(item)
        lines.append(pad + "- " + text.lstrip())
    return "\n".join(lines)


def scalar(v):
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (dict, list)):
        return "{}" if isinstance(v, dict) else "[]"
    return '"%s"' % str(v).replace("\\", "\\\\").replace('"', '\\"')  # always quoted


def parse(argv):
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.error = lambda message: sys.exit(entrypoint.fail("%s (see --help)" % message))
    p.add_argument("example", help="an example folder, e.g. DOWNPOUR")
    p.add_argument("--kind", choices=("tfjob", "plain"), default="tfjob")
    p.add_argument("--image", required=True, help="the image built from deploy/Dockerfile")
    p.add_argument("--ps", type=int, default=None, help="parameter servers (default: 1, if "
                   "the example has any)")
    p.add_argument("--workers", type=int, default=2, help="workers (default: 2)")
    p.add_argument("--name", default="", help="the run's name (default: the example's, "
                   "lowercase)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--volume_claim", default="", help="a PersistentVolumeClaim for /logs "
                   "(default: none, each pod has a directory of its own)")
    p.add_argument("--memory", default="2Gi", help="each pod's memory, requested and its limit "
                   "(default: 2Gi; a task of the examples peaks at about 0.8 GiB)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs for each worker (default: 0); the "
                   "image must then be built with CUDA (see deploy/README.md)")
    p.add_argument("--restarts", type=int, default=3, help="how often each worker may fail and "
                   "start again (default: 3; see deploy/README.md for how each kind counts)")
    p.add_argument("--ttl", type=int, default=86400, help="seconds after which Kubernetes "
                   "deletes a finished run's Jobs or TFJob, and their pods and logs (default: "
                   "86400, a day)")
    p.add_argument("--kubernetes", default="1.29", help="the cluster's Kubernetes version, "
                   "1.25 or newer (default: 1.29, the first that counts a plain Job's restarts "
                   "per worker)")
    p.add_argument("--pods", action="store_true", help="instead of the manifest, each pod's host "
                   "name, environment and program, as JSON (benchmarks/cluster.py runs them)")
    args = p.parse_args(argv[:split])
    args.train_args = argv[split + 1:]
    found = examples()
    deployable = ", ".join(example for example, jobs in found.items() if jobs)
    if args.example not in found:
        p.error("%r is not an example folder; choose one of: %s" % (args.example, deployable))
    jobs = found[args.example]
    if not jobs:
        p.error("%s trains in one process and reads no TF_CONFIG: run it in one pod, or choose "
                "one of: %s" % (args.example, deployable))
    if "ps" not in jobs and args.ps is not None:
        p.error("%s has no parameter servers: leave out --ps" % args.example)
    ps = 1 if args.ps is None else args.ps
    if ps < 1 or args.workers < 1:
        p.error("--ps and --workers must be at least 1")
    for flag in ("gpus", "restarts", "ttl"):
        if getattr(args, flag) < 0:
            p.error("--%s must be 0 or more" % flag)
    args.counts = {job: {"chief": 1, "ps": ps, "worker": args.workers}[job] for job in jobs}
    args.name = args.name or args.example.lower().replace("_", "-")
    # A Service's name must be a DNS-1035 label (a letter first); the pods' host names add
    # -<role>-<index> to it, and a host name has at most 63 characters.
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", args.name):
        p.error("--name %r: start with a lowercase letter, then use at most 39 lowercase "
                "letters, digits and '-', and end with a letter or digit" % args.name)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)", args.memory):
        p.error("--memory %r: a Kubernetes quantity with its unit, e.g. 2Gi or 1500Mi"
                % args.memory)
    version = re.fullmatch(r"v?1\.([0-9]+)(\.[0-9]+)?", args.kubernetes)
    if not version or int(version.group(1)) < 25:
        p.error("--kubernetes %r: give the cluster's version as 1.N, 1.25 or newer"
                % args.kubernetes)
    args.kubernetes = (1, int(version.group(1)))
    return args


def pods(args):
    """Each pod of the run as the manifest starts it: its host name, the environment that the
    operator (TFJob) or the manifest and Kubernetes (plain) give it, and the program it runs."""
    found = []
    for job, n in args.counts.items():
        for index in range(n):
            if args.kind == "tfjob":
                config = tfjob_tf_config(args.name, args.namespace, args.counts, job, index)
                address = config["cluster"][job][index]
                env = {"TF_CONFIG": json.dumps(config)}
                program = "%s/train.py" % args.example
            else:
                address = entrypoint.host(args.name, args.namespace, job, index)
                env = {e["name"]: e["value"] for e in plain_env(args, job)}
                env.update(POD_NAMESPACE=args.namespace, JOB_COMPLETION_INDEX=str(index))
                program = "deploy/entrypoint.py"
            found.append({"job": job, "index": index, "host": address.rsplit(":", 1)[0],
                          "env": env, "program": program})
    return found


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.pods:
        print(json.dumps(pods(args), indent=1))
        return 0
    docs = tfjob(args) if args.kind == "tfjob" else plain(args)
    print("\n---\n".join(to_yaml(d) for d in docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
