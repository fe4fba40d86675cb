"""The container's entrypoint on plain Kubernetes: build TF_CONFIG for this pod, then run the
example's train.py in its place.

A TFJob operator writes TF_CONFIG itself; without an operator nobody does, so each pod works it
out from what its manifest (deploy/manifests.py --kind plain) gives it:

    DTFG_EXAMPLE          the example folder, e.g. DOWNPOUR
    DTFG_NAME             the name of the run: the headless Service, and the Jobs' prefix
    DTFG_ROLE             chief, ps or worker (this pod's Indexed Job)
    DTFG_NUM_CHIEF        how many chief pods (1 for a coordinator, else 0),
    DTFG_NUM_PS           ps pods (0 for an example without parameter servers) and
    DTFG_NUM_WORKERS      worker pods the run has
    JOB_COMPLETION_INDEX  this pod's index in its Job (Kubernetes sets it in Indexed Jobs)
    POD_NAMESPACE         the namespace (from the downward API)

An Indexed Job names its pods' hosts <job>-<index>, and a headless Service with the same name as
the pods' subdomain gives each a DNS name: <name>-<role>-<index>.<name>.<namespace>.svc. Every
argument of this script goes on to train.py (for example --log_dir on a mounted volume).
"""
import json
import os
import sys

PORT = 2222
COUNTS = (("chief", "DTFG_NUM_CHIEF"), ("ps", "DTFG_NUM_PS"), ("worker", "DTFG_NUM_WORKERS"))


def host(name, namespace, role, index):
    return "%s-%s-%d.%s.%s.svc:%d" % (name, role, index, name, namespace, PORT)


def tf_config(env):
    """The TF_CONFIG of the pod whose environment is env."""
    name, namespace = env["DTFG_NAME"], env.get("POD_NAMESPACE", "default")
    counts = {role: int(env[variable]) for role, variable in COUNTS}
    cluster = {role: [host(name, namespace, role, i) for i in range(n)]
               for role, n in counts.items() if n > 0}  # a job with no pods is not in TF_CONFIG
    return json.dumps({"cluster": cluster, "task": {"type": env["DTFG_ROLE"],
                                                    "index": int(env["JOB_COMPLETION_INDEX"])}})


def main(argv):
    try:
        config = tf_config(os.environ)
        example = os.environ["DTFG_EXAMPLE"]
    except KeyError as e:
        return fail("entrypoint: %s is not set: the manifest sets it (deploy/manifests.py --kind plain)" % e)
    except ValueError as e:
        return fail("entrypoint: a count or index is not a whole number (%s)" % e)
    train_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            example, "train.py")
    os.environ["TF_CONFIG"] = config
    print("[entrypoint] TF_CONFIG=%s" % config, flush=True)
    os.execv(sys.executable, [sys.executable, train_py] + argv)  # train.py takes this process


def fail(message):
    """One `error:` line on stderr; returns the exit status, 2 (the manifests use it too)."""
    print("error: " + message, file=sys.stderr, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
