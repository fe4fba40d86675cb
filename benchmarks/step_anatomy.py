"""Where the time of one distributed step goes: the bound on between-graph throughput.

    python benchmarks/step_anatomy.py [--batch_size 128] [--hidden 128] [--steps 2000]

Builds Distributed-Setup's graph (1 ps + 1 worker on localhost) and Non-Distributed-Setup's,
and measures, each averaged over --steps session.run calls:
  - a one-process training step (the baseline);
  - the cheapest possible distributed step: read one scalar from the ps;
  - a distributed training step;
  - how many tensors cross between the processes in one step (from a full trace);
  - the CPU time the worker and the ps spend per step (from /proc).
"""
import argparse
import os
import subprocess
import sys
import time

import example_runs  # load_example: an example's train.py as a module
import published_tables  # the figures reach the READMEs only through here

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

template = example_runs.load_example("Distributed-Setup")  # its train.py, as a module

template.tf = tf  # train.py loads TensorFlow itself only in main(), after checking its flags


def server(cluster, job):
    return tf.compat.v1.train.Server(tf.compat.v1.train.ClusterSpec(cluster), job_name=job,
                                     task_index=0, start=True, config=tf.compat.v1.ConfigProto(
                                         intra_op_parallelism_threads=1))


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(session, fetches, steps, pids=()):
    """Steps per second of session.run(fetches), and CPU seconds per step of each pid."""
    for _ in range(100):
        session.run(fetches)
    cpu = [cpu_seconds(p) for p in pids]
    started = time.time()
    for _ in range(steps):
        session.run(fetches)
    seconds = time.time() - started
    return steps / seconds, [(cpu_seconds(p) - c) / steps for p, c in zip(pids, cpu)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=128, help="(default: 128)")
    p.add_argument("--hidden", type=int, default=128, help="(default: 128)")
    p.add_argument("--steps", type=int, default=2000, help="(default: 2000)")
    p.add_argument("--serve", default="", help=argparse.SUPPRESS)  # internal: be the ps
    p.add_argument("--no_publish", action="store_true", help="print only; leave the READMEs")
    args = p.parse_args()
    tf.compat.v1.disable_eager_execution()
    flags = template.parse_flags(["--batch_size", str(args.batch_size), "--hidden",
                                  str(args.hidden)], template.example_flags)
    data = template.load_dataset()

    if args.serve:
        cluster = dict(zip(("ps", "worker"), ([a] for a in args.serve.split(","))))
        server(cluster, "ps").join()  # killed by the parent when done

    with tf.Graph().as_default():  # one process, the baseline
        flags.task_index = 0
        local = example_runs.load_example("Non-Distributed-Setup", "local_train")
        local.tf = tf
        train_op = local.build_sgd(flags, *local.training_batches(  # an update, as it runs it
            data, flags.batch_size, 0, 1, flags.seed)).step
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            local.start_the_data(s, 0)
            local_rate, (local_cpu,) = rate(s, train_op, args.steps, [os.getpid()])

    addresses = example_runs.free_addresses(2)
    ps = subprocess.Popen([sys.executable, __file__, "--serve", ",".join(addresses)],
                          stderr=subprocess.DEVNULL)
    try:
        cluster = {"ps": addresses[:1], "worker": addresses[1:]}
        with tf.Graph().as_default():
            worker = server(cluster, "worker")
            for _ in range(300):  # the ps is up within a minute
                if template.is_listening(cluster["ps"][0]):
                    break
                time.sleep(0.2)
            x, y = template.training_batches(data, flags.batch_size, 0, 1, flags.seed)
            with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(  # as train() does
                    cluster=cluster, worker_device="/job:worker/task:0")):
                sgd = template.build_sgd(flags, x, y)
            global_step, train_op = sgd.global_step, sgd.step  # an update, as train.py runs it
            with tf.compat.v1.Session(worker.target, config=tf.compat.v1.ConfigProto(
                    device_filters=["/job:ps", "/job:worker/task:0"])) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                template.start_the_data(s, 0)
                read_rate, _ = rate(s, global_step, args.steps)
                step_rate, (worker_cpu, ps_cpu) = rate(s, train_op, args.steps,
                                                       [os.getpid(), ps.pid])
                metadata = tf.compat.v1.RunMetadata()
                s.run(train_op, run_metadata=metadata, options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    finally:
        ps.kill()
        ps.wait()
    transfers = sum(1 for d in metadata.step_stats.dev_stats for n in d.node_stats
                    if n.node_name == "RecvTensor")

    lines = [
        "batch %d, hidden %d, mean over %d calls each, %d CPU core(s)"
        % (args.batch_size, args.hidden, args.steps, os.cpu_count()),
        "one-process training step      %7.0f steps/s  %.3f ms  (CPU %.3f ms/step)"
        % (local_rate, 1e3 / local_rate, 1e3 * local_cpu),
        "distributed: read one scalar    %7.0f steps/s  %.3f ms  (ratio %.2f)"
        % (read_rate, 1e3 / read_rate, read_rate / local_rate),
        "distributed: training step      %7.0f steps/s  %.3f ms  (ratio %.2f)"
        % (step_rate, 1e3 / step_rate, step_rate / local_rate),
        "  tensors crossing processes per step: %d" % transfers,
        "  CPU per step: worker %.3f ms + ps %.3f ms = %.1fx the one-process step"
        % (1e3 * worker_cpu, 1e3 * ps_cpu, (worker_cpu + ps_cpu) / local_cpu)]
    print("\n".join(lines))
    if not args.no_publish:  # the README shows the default model's anatomy
        published_tables.publish("step_anatomy.py", "```\n%s\n```" % "\n".join(lines),
                       [published_tables.BENCHMARKS_README])


if __name__ == "__main__":
    main()
