"""The Python half of benchmarks/gpu_check.sh: run an example on logical GPUs cut from the one
GPU, and turn the runs' logs into the rows of the table.

    python benchmarks/gpu_check.py towers EXAMPLE [train.py flags]
        In-Graph-Replication or Model-Parallel-Pipeline alone, with its --devices N on N logical
        GPUs of GPU 0 (the example itself takes GPUs only when the machine has N of them).
    python benchmarks/gpu_check.py replicas N EXAMPLE [train.py flags]
        A MultiWorkerMirroredStrategy worker that sees GPU 0 as N logical GPUs: N replicas.
    python benchmarks/gpu_check.py row CHECK DIR
        The table row of one check, from the logs in DIR; exit status 1 if the check failed.

GPU_CHECK_ON=cpu (the dry run): the same runs with the CPU's devices instead, nothing split.
GPU_CHECK_MEMORY_MB: the memory of each logical GPU (default 2048), so that several processes
and logical GPUs share one card.
"""
import math
import os
import re
import sys

from example_runs import load_example  # an example's train.py as a module

ON_CPU = os.environ.get("GPU_CHECK_ON", "gpu") == "cpu"
MEMORY_MB = int(os.environ.get("GPU_CHECK_MEMORY_MB", "2048"))
LOSS_TOLERANCE = 2e-3  # as tests/test_in_graph_replication.py allows between two runs


# --- Runs on logical GPUs -------------------------------------------------------------------------
def towers(example, argv):
    """A one-client example (its run_devices and task_config, below its banner) run alone with
    a tower or stage on each of --devices logical GPUs. Its own run_devices counts physical
    GPUs, so on a machine with one GPU it would put the towers on CPUs."""
    module = load_example(example)
    example_config = module.task_config

    def run_devices(args, cluster):
        if cluster:
            module.fail("gpu_check.py towers runs the example alone: give no cluster")
        kind = "CPU" if ON_CPU else "GPU"
        return ["/device:%s:%d" % (kind, d) for d in range(args.devices)], "/device:CPU:0"

    def task_config(args):
        config = example_config(args)
        if not ON_CPU:  # a tf.compat.v1.Session given a config ignores tf.config's logical
            # devices, so the split goes into the session's own config
            config.gpu_options.experimental.virtual_devices.add(
                memory_limit_mb=[MEMORY_MB] * args.devices)
        return config
    module.run_devices, module.task_config = run_devices, task_config
    return module.main(argv)


def replicas(count, example, argv):
    """A TensorFlow 2 example whose strategy finds count logical GPUs, each MEMORY_MB, where
    the machine has one: MultiWorkerMirroredStrategy makes a replica of each."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    if not ON_CPU:  # before the strategy starts TensorFlow's runtime, or it is too late
        gpu = tf.config.list_physical_devices("GPU")[0]
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=MEMORY_MB)] * count)
    return load_example(example).main(argv)


# --- Reading the logs -----------------------------------------------------------------------------
def read(dir, name):
    path = os.path.join(dir, name)
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def summary(log):
    """The last summary line of a log as a dict of strings ({} if there is none)."""
    lines = [l for l in log.splitlines() if "] summary " in l]
    if not lines:
        return {}
    return dict(kv.split("=", 1) for kv in lines[-1].split("] summary ", 1)[1].split())


def losses(log):
    """{global step: loss} from the progress lines."""
    return {int(step): float(loss)
            for step, loss in re.findall(r"global_step=(\d+) loss=([-\d.e+naif]+)", log)}


def flag(log, name):
    """A flag's value in the command on a log's first line (gpu_check.sh writes it there)."""
    found = re.search(r"--%s (\S+)" % name, log.split("\n", 1)[0])
    return found.group(1) if found else None


def model_devices(log):
    found = re.findall(r"the model on \d+ device\(s\): (.*)", log)
    return found[-1].split() if found else []


def has_gpu_device(log):
    """Whether TensorFlow logged a GPU device for the process (TF_CPP_MIN_LOG_LEVEL=0)."""
    return bool(re.search(r"Created device \S*GPU:\d", log))


def failed_runs(dir, names):
    """'worker1 exit 124 (timed out)'... for each run in names that did not exit 0."""
    failed = []
    for name in names:
        code = read(dir, name + ".rc").strip() or "missing"
        if code != "0":
            why = {"124": " (timed out)", "137": " (killed after the timeout)"}.get(code, "")
            lines = [l for l in read(dir, name + ".log").splitlines() if "error" in l.lower()]
            failed.append("%s exit %s%s%s" % (name, code, why, ": " + lines[-1] if lines else ""))
    return failed


def expected_kind():
    return "CPU" if ON_CPU else "GPU"


def check_towers(dir):
    problems = failed_runs(dir, ["one", "two"])
    one, two = losses(read(dir, "one.log")), losses(read(dir, "two.log"))
    devices = model_devices(read(dir, "two.log"))
    want = ["/device:%s:%d" % (expected_kind(), d) for d in range(2)]
    if devices != want:
        problems.append("2 towers on %s, not %s" % (" ".join(devices) or "nothing", " ".join(want)))
    common = sorted(set(one) & set(two))
    gap = max([abs(one[s] - two[s]) for s in common] or [float("nan")])
    if not common:
        problems.append("no loss at the same step in both runs")
    elif not gap <= LOSS_TOLERANCE:
        problems.append("losses differ by %.2g (more than %g)" % (gap, LOSS_TOLERANCE))
    detail = "loss at steps %s: 1 tower %s, 2 towers %s (largest gap %.2g); towers on %s" % (
        ",".join(map(str, common)), ",".join("%.4f" % one[s] for s in common),
        ",".join("%.4f" % two[s] for s in common), gap, " ".join(devices))
    return problems, detail


def check_ps_cluster(dir):
    roles = ["ps0", "worker0", "worker1"]
    problems = failed_runs(dir, roles)
    on_gpu = [r for r in roles if has_gpu_device(read(dir, r + ".log"))]
    want = [] if ON_CPU else ["worker0", "worker1"]
    if on_gpu != want:
        problems.append("a GPU device in %s, not in %s" % (",".join(on_gpu) or "no task",
                                                            ",".join(want) or "no task"))
    accuracy = summary(read(dir, "worker0.log")).get("test_accuracy", "none")
    return problems, "GPU device in: %s; test accuracy %s" % (",".join(on_gpu) or "no task",
                                                             accuracy)


def check_mirrored(dir):
    problems = failed_runs(dir, ["worker0", "worker1"])
    log = read(dir, "worker0.log")
    chief = summary(log)
    want = 2 * (1 if ON_CPU else 2)  # 2 workers, each 2 logical GPUs (the CPU: one replica)
    steps, learning_rate = int(flag(log, "steps")), float(flag(log, "learning_rate"))
    if not chief:
        return problems + ["no summary from worker0"], ""
    found = round(float(chief["learning_rate_eff"]) / learning_rate)
    if found != want:
        problems.append("%d replicas in sync, not %d" % (found, want))
    if int(chief["global_step"]) != math.ceil(steps / want):
        problems.append("global_step %s, not %d" % (chief["global_step"], math.ceil(steps / want)))
    return problems, "%d replicas in sync: learning_rate_eff %s (%d x %g), global_step %s for " \
        "%d mini-batches; test accuracy %s" % (found, chief["learning_rate_eff"], found,
                                              learning_rate, chief["global_step"], steps,
                                              chief["test_accuracy"])


def check_pipeline(dir):
    problems = failed_runs(dir, ["m1", "m4"])
    want = ["/device:%s:%d" % (expected_kind(), d) for d in range(2)]
    parts = []
    for name, m in (("m1", 1), ("m4", 4)):
        log = read(dir, name + ".log")
        if model_devices(log) != want:
            problems.append("M=%d: stages on %s" % (m, " ".join(model_devices(log)) or "nothing"))
        busy = summary(log).get("stage_busy", "none")
        parts.append("M=%d: %s (GPipe's ideal %.2f)" % (m, busy, m / (m + 1)))  # K = 2 stages
    return problems, "stage busy fractions, %s; stages on %s" % ("; ".join(parts), " ".join(want))


def check_heavy(dir):
    problems = failed_runs(dir, ["gpu", "cpu"])
    rates = [float(summary(read(dir, name + ".log")).get("steps_per_sec", "nan"))
             for name in ("gpu", "cpu")]
    if not all(r > 0 for r in rates):
        problems.append("no steps_per_sec in a summary")
    where = "the CPU (dry run)" if ON_CPU else "the GPU"
    return problems, "mini-batches/s: %.1f on %s, %.1f on the CPU: %.2fx" % (
        rates[0], where, rates[1], rates[0] / rates[1] if rates[1] > 0 else float("nan"))


CHECKS = {
    "towers": ("In-Graph-Replication: 2 towers on 2 logical GPUs against 1 tower", check_towers),
    "Distributed-Setup": ("Distributed-Setup: 2 workers on the GPU, the ps on the CPU",
                          check_ps_cluster),
    "Sync-SGD": ("Sync-SGD: 2 workers on the GPU, the ps on the CPU", check_ps_cluster),
    "mirrored": ("MultiWorkerMirroredStrategy: 2 workers sharing the GPU, 2 replicas each",
                 check_mirrored),
    "pipeline": ("Model-Parallel-Pipeline: 2 stages on 2 logical GPUs", check_pipeline),
    "heavy": ("Non-Distributed-Setup --hidden 4096 --batch_size 512: the GPU against the CPU",
              check_heavy),
}


def row(check, dir):
    """Print the check's table row; 0 if it passed, else 1."""
    name, judge = CHECKS[check]
    if ON_CPU:
        name = name.replace("logical GPUs", "logical CPUs").replace("the GPU", "the CPU")
        name = name.replace("2 replicas each", "1 replica each")  # the strategy's one CPU
    try:
        problems, detail = judge(dir)
    except (KeyError, ValueError, TypeError) as e:  # a log without what the check reads
        problems, detail = ["cannot read the logs in %s (%s: %s)" % (dir, type(e).__name__, e)], ""
    result = "FAILED: " + "; ".join(problems) if problems else "ok"
    print("| %s | %s | %s |" % (name, result, detail.replace("|", "/")))
    return 1 if problems else 0


def main(argv):
    usage = "usage: gpu_check.py towers EXAMPLE ARGS | replicas N EXAMPLE ARGS | row CHECK DIR"
    if len(argv) >= 2 and argv[0] == "towers":
        return towers(argv[1], argv[2:])
    if len(argv) >= 3 and argv[0] == "replicas" and argv[1].isdigit():
        return replicas(int(argv[1]), argv[2], argv[3:])
    if len(argv) == 3 and argv[0] == "row" and argv[1] in CHECKS:
        return row(argv[1], argv[2])
    print("error: " + usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
