"""The container's entrypoint on plain Kubernetes: build TF_CONFIG for this pod, then run the
example's train.py in its place.

A TFJob operator writes TF_CONFIG itself; without an operator nobody does, so each pod works it
out from what its manifest (deploy/manifests.py --kind plain) gives it:

    DTFG_EXAMPLE          the example folder, e.g. DOWNPOUR
    DTFG_NAME             the name of the run: the headless Service, and the Jobs' prefix
    DTFG_ROLE             ps or worker (this pod's Indexed Job)
    DTFG_NUM_PS           how many ps pods, and
    DTFG_NUM_WORKERS      how many worker pods the run has
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


def host(name, namespace, role, index):
    return "%s-%s-%d.%s.%s.svc:%d" % (name, role, index, name, namespace, PORT)


def tf_config(env):
    """The TF_CONFIG of the pod whose environment is env."""
    name, namespace = env["DTFG_NAME"], env.get("POD_NAMESPACE", "default")
    cluster = {role: [host(name, namespace, role, i) for i in range(int(env[count]))]
               for role, count in (("ps", "DTFG_NUM_PS"), ("worker", "DTFG_NUM_WORKERS"))}
    return json.dumps({"cluster": cluster, "task": {"type": env["DTFG_ROLE"],
                                                    "index": int(env["JOB_COMPLETION_INDEX"])}})


def main(argv):
    try:
        config = tf_config(os.environ)
    except (KeyError, ValueError) as e:
        print("error: entrypoint: %s is missing or not a number: set it in the manifest" % e,
              file=sys.stderr)
        return 2
    train_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            os.environ["DTFG_EXAMPLE"], "train.py")
    os.environ["TF_CONFIG"] = config
    print("[entrypoint] TF_CONFIG=%s" % config, flush=True)
    os.execv(sys.executable, [sys.executable, train_py] + argv)  # train.py takes this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
