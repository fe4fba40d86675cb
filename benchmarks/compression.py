"""Gradient-Compression: the bytes each compressor sends, the accuracy it keeps, and how soon it
reaches the target on a slow network.

    sudo python benchmarks/compression.py                      # about 15 minutes on 2 cores
    sudo python benchmarks/compression.py --compressors none,topk,powersgd,sign,qsgd --seeds 0,1,2
    sudo python benchmarks/compression.py --quick              # a smoke run that publishes nothing

Every run uses --hidden 1024 (76,810 parameters, 307 kB in fp32), so that the messages, not
gRPC's framing, dominate. For each compressor (Gradient-Compression's defaults otherwise: top-k
at 1% with error feedback, PowerSGD rank 2, ...):
  bytes per worker per step, each way: from the messages' sizes (the summary's push_bytes and
      pull_bytes), and on the wire: a non-chief worker's interface counters in cluster.py over
      the steps (the chief also reads the parameters to evaluate them);
  encode + decode: the time to compress and decompress the model's tensors once, in-process;
  test accuracy: the median (and range) over --seeds of run.sh runs with 2 workers and --steps
      mini-batches, the same examples for every compressor;
  seconds to the target test accuracy (0.95; 0.55 with --problem mnist1d): cluster.py with 3
      workers, every task a host of its own, links at each of --bandwidth (100mbit,20mbit).
Writes compression.md and logs/compression-* into --out; the default run publishes its table
in benchmarks/README.md. Needs what cluster.py needs: root, ip and tc.
"""
import argparse
import os
import statistics
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, the rates, the counters
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how every benchmark runs an example and reads its metrics
import command_line  # link rates and the one-line error
from example_runs import time_to_target

EXAMPLE = "Gradient-Compression"
HIDDEN = 1024


def codec_seconds(compressor_name, repeats=30):
    """Median seconds to encode and decode every tensor of the --hidden 1024 MLP once (PowerSGD:
    its two products and the orthonormalisation, as a worker computes them), in this process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    module = example_runs.load_example(EXAMPLE, "gc_train")
    module.tf = tf
    tf.compat.v1.disable_eager_execution()
    args = module.parse_flags(["--compressor", compressor_name, "--hidden", str(HIDDEN)],
                              module.example_flags)
    shapes = {"w1": [64, HIDDEN], "b1": [HIDDEN], "w2": [HIDDEN, 10], "b2": [10]}
    with tf.Graph().as_default() as graph:
        compressor = module.COMPRESSORS[compressor_name](args)
        outputs = []
        for i, (name, shape) in enumerate(shapes.items()):
            x = tf.Variable(np.random.default_rng(i).normal(size=shape).astype(np.float32))
            x = x.read_value()  # read at every run: a constant's work would be folded away once
            if compressor_name == "powersgd":
                if not compressor.compresses(x.shape):
                    outputs.append(x)
                    continue
                q = tf.random.stateless_normal([shape[1], args.rank], [0, i])
                p = tf.linalg.qr(tf.matmul(x, q))[0]
                outputs.append(tf.matmul(p, tf.matmul(x, p, transpose_a=True), transpose_b=True))
            else:
                seed = tf.constant([0, i], tf.int64)
                outputs.append(compressor.decode(compressor.encode(x, seed), x.shape, seed))
        work = tf.add_n([tf.reduce_sum(o) for o in outputs])  # a group's ops may be pruned
        initialise = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1)) as session:
        session.run(initialise)
        session.run(work)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            session.run(work)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def wire_bytes_per_step(metrics):
    """(sent, received) bytes per step of worker1, a worker that does not evaluate."""
    host = metrics["cluster"]["hosts"]["worker1"]
    steps = max(metrics["global_step"], 1)
    return host["sent_bytes"] / steps, host["received_bytes"] / steps


def kilobytes(n):
    return "%.1f" % (n / 1e3) if n < 1e5 else "%.0f" % (n / 1e3)


def seconds(value):
    return "not reached" if value is None else "%.0f" % value


def write_table(path, results, rates, settings, target):
    """results: {compressor: {"accuracy": [metrics per seed], rate label: cluster metrics,
    "codec": seconds}}."""
    base = results.get("none")
    columns = (["compressor", "pushed: message kB", "pushed: wire kB", "pulled: message kB",
                "pulled: wire kB", "wire push vs none", "encode + decode ms",
                "test accuracy: median (min-max)", "vs none"]
               + ["s to %.2f, %s" % (target, label) for label, _ in rates]
               + ["vs none, %s" % rates[-1][0]])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    base_push = wire_bytes_per_step(base[rates[0][0]])[0] if base else None
    base_accuracy = (statistics.median(m["test_accuracy"] for m in base["accuracy"])
                     if base else None)
    base_reach = time_to_target(base[rates[-1][0]], target) if base else None
    for name, r in results.items():
        slowest = r[rates[-1][0]]
        push_wire, pull_wire = wire_bytes_per_step(r[rates[0][0]])
        accuracies = [m["test_accuracy"] for m in r["accuracy"]]
        accuracy = statistics.median(accuracies)
        reach = [time_to_target(r[label], target) for label, _ in rates]
        faster = ("n/a" if base_reach is None or reach[-1] is None
                  else "%.1fx sooner" % (base_reach / reach[-1]))
        lines.append("| " + " | ".join(
            [name, kilobytes(slowest["push_bytes"]), kilobytes(push_wire),
             kilobytes(slowest["pull_bytes"]), kilobytes(pull_wire),
             "n/a" if base_push is None else "%.1fx less" % (base_push / push_wire),
             "%.2f" % (1e3 * r["codec"]),
             "%.3f (%.3f-%.3f)" % (accuracy, min(accuracies), max(accuracies)),
             "n/a" if base_accuracy is None else "%+.3f" % (accuracy - base_accuracy)]
            + [seconds(s) for s in reach] + [faster]) + " |")
    lines += ["", "kB per worker per step (1 kB = 1000 bytes). Message: the tensors a worker "
              "pushes or pulls; wire: worker1's interface counters over the run's steps in the "
              "%s run, so gRPC's and TCP's framing, the first read of the parameters and the "
              "start-up are in it. Accuracy: run.sh with 2 workers, %d mini-batches, seeds %s. "
              "Seconds to %.2f: cluster.py, %d workers, every task a host of its own, %d "
              "mini-batches. encode + decode: every tensor once, one thread."
              % (rates[0][0], settings["steps"], settings["seeds"], target, settings["workers"],
                 settings["steps"]),
              "",
              "`%s`: --hidden %d, every other flag Gradient-Compression's default; on one "
              "machine with %d CPU cores, shared with other work while it ran."
              % (settings["command"], HIDDEN, os.cpu_count())]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def parser():
    p = example_runs.argparse_for("compression.py", __doc__)
    example_runs.add_run_flags(p, steps=900, eval_every=20, problem=True)
    p.add_argument("--compressors", default="none,topk,powersgd",
                   help="comma-separated (default: none,topk,powersgd)")
    p.add_argument("--seeds", default="0,1,2", help="the accuracy runs' seeds (default: 0,1,2)")
    p.add_argument("--bandwidth", default="100mbit,20mbit",
                   help="link rates of the timed runs (default: 100mbit,20mbit)")
    p.add_argument("--workers", type=int, default=3, help="workers of the timed runs (default: 3)")
    p.add_argument("--quick", action="store_true",
                   help="300 steps, one seed, top-k and none: a smoke run that publishes nothing")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(), argv)
    if args.quick:
        args.steps, args.seeds, args.compressors = 300, "0", "none,topk"
    try:
        rates = [(label, command_line.link_rate(label)) for label in args.bandwidth.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
        names = [c.strip() for c in args.compressors.split(",") if c.strip()]
        if not args.from_logs:
            cluster.check_machine(needs_tc=True)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    started, results = time.time(), {}
    plan = len(names) * (len(seeds) + len(rates))
    done = 0
    for name in names:
        train_args = ["--compressor", name, "--hidden", str(HIDDEN)]
        results[name] = {"accuracy": [], "codec": codec_seconds(name)}
        for seed in seeds:
            done += 1
            print("[%d/%d] %s, seed %d (%.0f s so far)" % (done, plan, name, seed,
                                                           time.time() - started),
                  file=sys.stderr, flush=True)
            seeded = argparse.Namespace(**dict(vars(args), seed=seed))
            results[name]["accuracy"].append(example_runs.run_example(
                EXAMPLE, 2, seeded, "compression-%s-seed%d" % (name, seed), train_args,
                who="compression"))
        for label, _ in rates:
            done += 1
            print("[%d/%d] %s, %d workers, links %s (%.0f s so far)" % (
                done, plan, name, args.workers, label, time.time() - started),
                file=sys.stderr, flush=True)
            results[name][label] = example_runs.run_example(
                EXAMPLE, args.workers, args, "compression-%s-%s" % (name, label), train_args,
                bandwidth=label, who="compression")
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command("compression.py", argv, sudo=True),
                    steps=args.steps, seeds=args.seeds, workers=args.workers)
    table = write_table(os.path.join(args.out, "compression.md"), results, rates, settings,
                        args.target)
    print(table)
    if example_runs.publishing(args, args.quick, published=("digits", "mnist1d")):
        published_tables.publish(example_runs.section("compression.py", args), table,
                                 [published_tables.BENCHMARKS_README])
    print("\nwrote compression.md to %s in %.0f s" % (args.out, time.time() - started),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
