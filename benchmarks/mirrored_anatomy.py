"""Where the time of one MultiWorkerMirroredStrategy step goes, on workers of their own.

    python benchmarks/mirrored_anatomy.py [--workers 3] [--cpus 0.4] [-- train.py flags]
    sudo python benchmarks/mirrored_anatomy.py --cpus 0.4 -- --all_reduce per_variable

Starts --workers processes on localhost, each a worker of the example's cluster that builds the
example's own strategy, variables, dataset and step (build_mirrored, with the train.py flags
after `--`; by default --hidden 4096 --batch_size 512, the scaling benchmark's workload). With
--cpus C each worker gets a cgroup CPU quota of C cores (benchmarks/cluster.py's; root), so
that, as on the scaling benchmark's hosts, no worker takes another's CPU. Each worker then
times, in the same order (the collectives keep them in step), median steps/s over --repeats
blocks of --steps calls:
  - the example's training step (train_step); the same step with the loss's mean reduced by a
    collective of its own (strategy.reduce, as the example did before the loss rode in the
    gradients' all-reduce); and with no collective at all (each worker its own gradient);
  - the gradients' all-reduce alone, as the step launches it, and one collective per variable;
  - one scalar's all-reduce (what strategy.reduce of the loss cost);
  - the chief's evaluation of the test set, which the others wait for at their next collective.
Worker 0 prints the table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import example_runs  # load_example: an example's train.py as a module

EXAMPLE = "MultiWorkerMirroredStrategy"
WORKLOAD = ["--hidden", "4096", "--batch_size", "512"]  # the scaling benchmark's


def median_rates(calls, steps, repeats):
    """For each call: the median (and range) of its calls per second over repeats blocks of
    steps calls, after a warm-up. The blocks take turns, so that a machine whose load drifts
    slows every call alike."""
    for call in calls:
        for _ in range(3):
            call()
    rates = [[] for _ in calls]
    for _ in range(repeats):
        for call, its_rates in zip(calls, rates):
            started = time.time()
            for _ in range(steps):
                call()
            its_rates.append(steps / (time.time() - started))
    return [(statistics.median(r), min(r), max(r)) for r in rates]


def worker(args, train_flags):
    """One worker: builds the example's step and its parts, and times each (see the docstring)."""
    hosts = args.hosts.split(",")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": hosts},
                                          "task": {"type": "worker", "index": args.worker}})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    example = example_runs.load_example(EXAMPLE)
    example.tf = tf  # train.py loads TensorFlow itself only in main(), after checking its flags
    flags = example.parse_flags(WORKLOAD + train_flags + [
        "--worker_hosts", args.hosts, "--task_index", str(args.worker), "--log_dir",
        os.devnull], example.example_flags)
    data = example.load_dataset(flags.data_path)
    cluster = {"worker": hosts}
    mirrored = example.build_mirrored(flags, cluster, data)
    strategy, params = mirrored.strategy, list(mirrored.params.values())

    @tf.function
    def step_without_collectives(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = example.model_loss(mirrored.params, x, y)
            for p, g in zip(params, tape.gradient(loss, params)):
                p.assign_sub(0.0 * g)  # the copies must stay equal for the next variant
            return loss
        return strategy.experimental_local_results(strategy.run(replica, args=next(iterator)))

    learning_rate = flags.learning_rate * strategy.num_replicas_in_sync

    @tf.function
    def step_with_a_collective_for_the_loss(iterator):  # the step as it was before --bytes_per_pack
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = example.model_loss(mirrored.params, x, y)
            gradients = tape.gradient(loss, params)
            mean = tf.distribute.get_replica_context().all_reduce("mean", gradients)
            for p, g in zip(params, mean):
                p.assign_sub(learning_rate * g)
            return loss
        loss = strategy.run(replica, args=next(iterator))
        mirrored.global_step.assign_add(1)
        return strategy.reduce("mean", loss, axis=None)

    gradients = [tf.ones_like(p) for p in params]  # the all-reduce's payload: every gradient

    def all_reduce(options):
        @tf.function
        def collective():
            return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                "mean", gradients, options=options))
        return collective

    packed = all_reduce(None)  # the strategy's own options: how the step launches it
    per_variable = all_reduce(tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1))

    @tf.function
    def scalar():
        return strategy.reduce("mean", strategy.run(lambda: tf.constant(1.0)), axis=None)

    def evaluate():
        for x, y in example.test_batches(data):
            for value in example.model_metrics(mirrored.params, x, y).values():
                float(value)

    timed = [("training step (the example's)", lambda: mirrored.train_step(mirrored.iterator)),
             ("  a step, the loss's mean a collective apart",
              lambda: step_with_a_collective_for_the_loss(mirrored.iterator)),
             ("  a step with no collective", lambda: step_without_collectives(mirrored.iterator)),
             ("gradients' all-reduce alone", packed),
             ("  the same, one collective per variable", per_variable),
             ("one scalar's all-reduce", scalar)]
    rows = list(zip([name for name, _ in timed], median_rates(
        [call for _, call in timed], args.steps, args.repeats)))
    rows += [("chief's evaluation of the test set", median_rates([evaluate], 3, args.repeats)[0])]
    if args.worker == 0:
        lines = ["%d workers%s, flags %s; median (range) over %d blocks of %d calls"
                 % (len(hosts), ", %g core(s) each" % args.cpus if args.cpus else "",
                    " ".join(WORKLOAD + train_flags), args.repeats, args.steps)]
        for name, (median, low, high) in rows:
            lines.append("%-42s %7.1f /s  %8.2f ms  (%.1f-%.1f /s)"
                         % (name, median, 1e3 / median, low, high))
        print("\n".join(lines), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the strategy's threads would keep an ordinary exit waiting


def main():
    argv = sys.argv[1:]
    train_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3, help="(default: 3)")
    p.add_argument("--cpus", type=float, default=None,
                   help="a CPU quota of this many cores for each worker (root; default: none)")
    p.add_argument("--steps", type=int, default=20, help="calls per timed block (default: 20)")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks (default: 5)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # internal
    p.add_argument("--hosts", default="", help=argparse.SUPPRESS)  # internal
    args = p.parse_args(argv)
    if args.worker is not None:
        return worker(args, train_flags)

    hosts = ",".join(example_runs.free_addresses(args.workers))
    quotas = None
    if args.cpus:
        import cluster  # benchmarks/cluster.py: its cgroup quotas, made here and removed at the end
        quotas = cluster.CpuQuotas("mwanatomy%d" % os.getpid(),
                                   ["worker%d" % i for i in range(args.workers)], args.cpus)
    procs, codes = [], [1]
    try:
        if quotas:
            quotas.create()
        for i in range(args.workers):
            prefix = quotas.join_command("worker%d" % i) if quotas else []
            procs.append(subprocess.Popen(
                prefix + [sys.executable, os.path.abspath(__file__), "--worker", str(i),
                          "--hosts", hosts, "--steps", str(args.steps), "--repeats",
                          str(args.repeats)] + (["--cpus", str(args.cpus)] if args.cpus else [])
                + ["--"] + train_flags, stdout=None if i == 0 else subprocess.DEVNULL))
        codes = [proc.wait(timeout=1800) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for problem in quotas.remove() if quotas else []:
            print("warning: " + problem, file=sys.stderr)
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
