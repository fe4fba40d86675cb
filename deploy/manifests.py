"""Kubernetes manifests for any example, with the Kubeflow operator (TFJob) or without (plain).

    python deploy/manifests.py DOWNPOUR --image REGISTRY/dtfg:1 > downpour.yaml
    python deploy/manifests.py Sync-SGD --kind plain --workers 3 --image REGISTRY/dtfg:1 \\
        --volume_claim training-logs -- --steps 20000 > sync.yaml
    kubectl apply -f downpour.yaml

--kind tfjob: one TFJob (kubeflow.org/v1) with PS and Worker replicas; the operator writes each
pod's TF_CONFIG (<name>-<type>-<i>.<namespace>.svc:2222) and, with successPolicy AllWorkers,
ends the job when every worker is done. --kind plain: a headless Service, a NetworkPolicy and
two Indexed Jobs (ps and worker) that run deploy/entrypoint.py, which builds TF_CONFIG itself.
Both add a NetworkPolicy: the TensorFlow servers have no authentication, so only the run's own
pods may reach their port. Arguments after -- go to every train.py. --volume_claim mounts a
PersistentVolumeClaim at /logs and passes --log_dir /logs/<name>: checkpoints then outlive a
pod, and a restarted chief resumes from them.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import entrypoint  # noqa: E402  (deploy/ is not a package; the entrypoint names the hosts)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = entrypoint.PORT


def examples():
    """The examples that run as a cluster: a run.sh, and a train.py with the cluster plumbing
    (which reads TF_CONFIG)."""
    found = []
    for d in sorted(os.listdir(ROOT)):
        train_py = os.path.join(ROOT, d, "train.py")
        if os.path.isfile(train_py) and os.path.isfile(os.path.join(ROOT, d, "run.sh")):
            with open(train_py) as f:
                if "# >>> shared: cluster" in f.read():
                    found.append(d)
    return found


def container(args, command, env=()):
    c = {"name": "tensorflow",  # TFJob writes TF_CONFIG only into a container of this name
         "image": args.image, "command": command,
         "ports": [{"name": "tfjob-port", "containerPort": PORT}],
         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    if env:
        c["env"] = list(env)
    if args.volume_claim:
        c["volumeMounts"] = [{"name": "logs", "mountPath": "/logs"}]
    return c


def pod_spec(args, command, restart, env=(), subdomain=None):
    spec = {"restartPolicy": restart, "containers": [container(args, command, env)]}
    if subdomain:
        spec["subdomain"] = subdomain
    if args.volume_claim:
        spec["volumes"] = [{"name": "logs",
                            "persistentVolumeClaim": {"claimName": args.volume_claim}}]
    return spec


def train_args(args):
    return (["--log_dir", "/logs/" + args.name] if args.volume_claim else []) + args.train_args


def labels(args, role):
    return {"app.kubernetes.io/part-of": "dtfg", "dtfg/run": args.name, "dtfg/role": role}


def network_policy(args):
    """Only the run's own pods may reach the TensorFlow port of its pods."""
    run = {"matchLabels": {"dtfg/run": args.name}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": args.name + "-only-its-own-pods", "namespace": args.namespace},
            "spec": {"podSelector": run, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": run}],
                                  "ports": [{"protocol": "TCP", "port": PORT}]}]}}


# A ps that restarts has lost the parameters, so it does not restart (the run fails and is
# started again, resuming from the last checkpoint); a worker that restarts rejoins the run.
RESTART = {"ps": "Never", "worker": "OnFailure"}


def tfjob(args):
    command = ["python", "/app/%s/train.py" % args.example] + train_args(args)
    replica = lambda role, n: {
        "replicas": n, "restartPolicy": RESTART[role],
        "template": {"metadata": {"labels": labels(args, role),
                                  "annotations": {"sidecar.istio.io/inject": "false"}},
                     "spec": pod_spec(args, command, RESTART[role])}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
           "metadata": {"name": args.name, "namespace": args.namespace},
           "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                    "successPolicy": "AllWorkers",
                    "tfReplicaSpecs": {"PS": replica("ps", args.ps),
                                       "Worker": replica("worker", args.workers)}}}
    return [job, network_policy(args)]


def tfjob_tf_config(name, namespace, ps, workers, task_type, index):
    """The TF_CONFIG the operator gives a TFJob pod, as its documentation describes it."""
    host = lambda role, i: "%s-%s-%d.%s.svc:%d" % (name, role, i, namespace, PORT)
    return {"cluster": {"ps": [host("ps", i) for i in range(ps)],
                        "worker": [host("worker", i) for i in range(workers)]},
            "task": {"type": task_type, "index": index}, "environment": "cloud"}


def plain(args):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": args.name, "namespace": args.namespace},
               "spec": {"clusterIP": "None",  # headless: one DNS name per pod
                        "selector": {"dtfg/run": args.name},
                        "ports": [{"name": "tfjob-port", "port": PORT}]}}
    docs = [service, network_policy(args)]
    for role, n in (("ps", args.ps), ("worker", args.workers)):
        env = plain_env(args, role) + [{"name": "POD_NAMESPACE", "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.namespace"}}}]
        docs.append({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "%s-%s" % (args.name, role), "namespace": args.namespace},
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n,
                     "backoffLimit": 0 if RESTART[role] == "Never" else 3,
                     "template": {"metadata": {"labels": labels(args, role)},
                                  "spec": pod_spec(args, ["python", "/app/deploy/entrypoint.py"]
                                                   + train_args(args), RESTART[role], env,
                                                   subdomain=args.name)}}})
    return docs


def plain_env(args, role):
    """What deploy/entrypoint.py reads (JOB_COMPLETION_INDEX comes from Kubernetes)."""
    return [{"name": k, "value": str(v)} for k, v in (
        ("DTFG_EXAMPLE", args.example), ("DTFG_NAME", args.name), ("DTFG_ROLE", role),
        ("DTFG_NUM_PS", args.ps), ("DTFG_NUM_WORKERS", args.workers))]


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
    p.error = lambda message: sys.exit(print("error: %s (see --help)" % message,
                                             file=sys.stderr) or 2)
    p.add_argument("example", help="an example folder, e.g. DOWNPOUR")
    p.add_argument("--kind", choices=("tfjob", "plain"), default="tfjob")
    p.add_argument("--image", required=True, help="the image built from deploy/Dockerfile")
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--name", default="", help="the run's name (default: the example's, "
                   "lowercase)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--volume_claim", default="", help="a PersistentVolumeClaim for /logs")
    args = p.parse_args(argv[:split])
    args.train_args = argv[split + 1:]
    if args.example not in examples():
        p.error("%r is not an example that runs as a cluster; choose one of: %s"
                % (args.example, ", ".join(examples())))
    if args.ps < 1 or args.workers < 1:
        p.error("--ps and --workers must be at least 1")
    args.name = args.name or args.example.lower().replace("_", "-")
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    docs = tfjob(args) if args.kind == "tfjob" else plain(args)
    print("\n---\n".join(to_yaml(d) for d in docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
