"""The Python half of train.sbatch: the job's cluster, and each task's role in it.

    python3 tasks.py cluster EXAMPLE/train.py --port_base P [--ps N]   # once, in the batch script
    python3 tasks.py run EXAMPLE/train.py [ARGUMENTS...]                # in every task (srun)

cluster prints the cluster as JSON ({"ps": ["n1:10000"], "worker": [...]}), from TensorFlow's
SlurmClusterResolver: the jobs the example's train.py declares (its JOBS, read by
deploy/manifests.py), a chief first where it has a coordinator, then N ps where it has any (1),
the other tasks workers. It runs once for the job, before the job step, so that TensorFlow
loads once and not once more in every task (its import takes about as long as a task's whole
start). The resolver counts a GPU for each task and sets none: on a node without GPUs its
defaults fail, and where the nodes have them, Slurm gives each task its own (--gpus-per-task).

run needs no TensorFlow: it finds its own address in the cluster (its node, and --port_base
plus its place on the node), writes TF_CONFIG, runs train.py, prefixes each line of its output
with the role ([worker1]), and exits as train.py did, saying in one line if it failed (unless
the step was being stopped: scancel, a time limit, srun ending it). It reads

    DTFG_CLUSTER          the cluster, as cluster printed it
    DTFG_PORT_BASE        the port of a node's first task
    SLURMD_NODENAME, SLURM_LOCALID, SLURM_PROCID   (Slurm sets them in every task)
    VERBOSE=1             keep TensorFlow's start-up lines, which are otherwise dropped
"""
import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import manifests  # noqa: E402  (deploy/manifests.py: the one reader of a train.py's JOBS)

# TensorFlow's start-up chatter, as run.sh drops it: "To enable the following instructions",
# absl's "WARNING: All log messages before ...", and its C++ info and warning lines
NOISE = re.compile(r"^(To enable the following|WARNING: All log messages before|E[0-9]{4} .*cuInit"
                   r"|[IW][0-9]{4} [0-9:. ]+ [0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\])")


def fail(message):
    print("[slurm] error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def job_counts(train_py, tasks, ps):
    """How many tasks each job gets, in TF_CONFIG's job names."""
    jobs = manifests.declared_jobs(train_py)
    example = os.path.basename(os.path.dirname(train_py))
    if not jobs:
        fail("%s trains in one process and reads no TF_CONFIG: run it with srun -n 1 python3 "
             "%s" % (example, train_py))
    if "ps" not in jobs and ps is not None:
        fail("%s has no parameter servers: leave out --ps" % example)
    counts = {"chief": 1 if "chief" in jobs else 0, "ps": 1 if ps is None else ps}
    if "ps" not in jobs:
        counts["ps"] = 0
    elif counts["ps"] < 1:
        fail("--ps must be 1 or more, got %d" % counts["ps"])
    counts["worker"] = tasks - counts["chief"] - counts["ps"]
    if counts["worker"] < 1:
        fail("%d task(s) leave no worker for %s: ask Slurm for at least %d (--ntasks)"
             % (tasks, example, counts["chief"] + counts["ps"] + 1))
    return {job: n for job, n in counts.items() if n}


@contextlib.contextmanager
def stderr_silenced():
    """TensorFlow's C++ start-up lines (oneDNN, CUDA) go to file 2 whatever the log level."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cluster(argv):
    p = argparse.ArgumentParser(prog="tasks.py cluster")
    p.error = lambda message: fail(message)
    p.add_argument("train_py")
    p.add_argument("--port_base", type=int, required=True)
    p.add_argument("--ps", type=int, default=None)
    args = p.parse_args(argv)
    if not 1024 <= args.port_base <= 65000:
        fail("--port_base must be between 1024 and 65000, got %d" % args.port_base)
    tasks = int(os.environ["SLURM_NTASKS"])
    counts = job_counts(args.train_py, tasks, args.ps)
    # The resolver reads the layout of the job step it runs in; this runs in the batch script,
    # before the step, so it is given the job's, which the step that srun starts takes.
    os.environ.update(SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
                      SLURM_STEP_TASKS_PER_NODE=os.environ["SLURM_TASKS_PER_NODE"],
                      SLURM_STEP_NUM_TASKS=str(tasks))
    try:
        with stderr_silenced():
            import tensorflow as tf
    except ImportError as e:
        fail("%s cannot import TensorFlow (%s): give the job the Python of requirements.txt "
             "(PYTHON=...)" % (sys.executable, e))
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=counts, port_base=args.port_base,
        # defaults fail on CPU nodes (nvidia-smi; 0 divides by zero); Slurm binds GPUs itself
        gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)
    spec = resolver.cluster_spec().as_dict()
    print(json.dumps({job: spec[job] for job in manifests.JOBS if job in spec}))


def own_role(cluster_spec):
    """(job, index) of this task: the one whose address is its node and its port."""
    node, place = os.environ["SLURMD_NODENAME"], int(os.environ["SLURM_LOCALID"])
    address = "%s:%d" % (node, int(os.environ["DTFG_PORT_BASE"]) + place)
    # The resolver numbers the addresses over its nodes sorted by name, as Slurm numbers its
    # tasks only where the names sort as Slurm orders the nodes (not n9, n10) and the tasks are
    # placed in blocks (srun's default): so each task looks for its own address instead.
    for job, addresses in cluster_spec.items():
        if address in addresses:
            return job, addresses.index(address), address
    fail("task %s on %s: its address %s is not in the cluster %s" % (
        os.environ.get("SLURM_PROCID"), node, address, json.dumps(cluster_spec)))


def run(argv):
    if not argv:
        fail("usage: tasks.py run EXAMPLE/train.py [ARGUMENTS...]")
    cluster_spec = json.loads(os.environ["DTFG_CLUSTER"])
    job, index, address = own_role(cluster_spec)
    role, task = "%s%d" % (job, index), "task %s on %s" % (
        os.environ.get("SLURM_PROCID"), os.environ["SLURMD_NODENAME"])
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster_spec,
                                                 "task": {"type": job, "index": index}}))
    stopped = []  # scancel, a time limit or srun stopping the step signal every process of it
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # train.py's too: let it end
        signal.signal(signum, lambda signum, frame: stopped.append(signum))
    child = subprocess.Popen([sys.executable] + argv, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace")
    print("[slurm] started %s pid=%d at %s (%s)" % (role, child.pid, address, task), flush=True)
    keep_noise = os.environ.get("VERBOSE") == "1"
    prefix = "[%s] " % role
    for line in child.stdout:
        if keep_noise or not NOISE.match(line):
            print(prefix + (line[len(prefix):] if line.startswith(prefix) else line).rstrip("\n"),
                  flush=True)
    code = child.wait()
    if code and not stopped:
        how = ("killed by %s" % signal.Signals(-code).name) if code < 0 else "exit %d" % code
        print("[slurm] failed: %s (%s: %s); srun ends the job step" % (role, task, how),
              flush=True)
    return 128 - code if code < 0 else code


def main(argv):
    if argv[:1] == ["cluster"]:
        return cluster(argv[1:])
    if argv[:1] == ["run"]:
        return run(argv[1:])
    fail("usage: tasks.py cluster EXAMPLE/train.py --port_base P [--ps N], or tasks.py run "
         "EXAMPLE/train.py [ARGUMENTS...]")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
