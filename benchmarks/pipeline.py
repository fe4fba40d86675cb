"""GPipe's bubble, measured: Model-Parallel-Pipeline over 2 stages, each a host of its own with a
CPU quota, at M = 1, 2, 4 and 8 micro-batches per mini-batch.

    sudo python benchmarks/pipeline.py                     # the published run
    sudo python benchmarks/pipeline.py --cpus 1 --micro_batches 1,4
    sudo python benchmarks/pipeline.py --quick             # a smoke run; publishes nothing
    python benchmarks/pipeline.py --from_logs              # redraw, no training

Every stage runs through benchmarks/cluster.py on a host of its own: a network namespace, and a
cgroup CPU quota of --cpus cores (0.4 by default), so that a stage waiting for the other leaves
its host's CPU unused, as a machine of its own would. With K stages and M micro-batches, a stage
is busy M / (M + K - 1) of a step at best, and a mini-batch takes (M + K - 1) / M stage-times
instead of K: the ideal speed-up over M = 1 is K M / (M + K - 1), 1.6 for K = 2, M = 4. The
model is --hidden 1024 with --layers 5 (four 1024 x 1024 matrices, two per stage) and a
mini-batch of --batch_size 4096, so that a stage computes for seconds per step: a CPU quota
is enforced in 100 ms periods, and a host that idled since its last period may run at full
speed for a while, which would hide the bubble in short steps.

Writes into --out:
  pipeline.md    one row per M: mini-batches/s, speed-up over M = 1 and its ideal, each
                 stage's busy fraction (measured in traced steps, one in --eval_every: time
                 running ops over the step) and its ideal; and whether the goal (M = 4 at least
                 1.4 times M = 1) was reached;
  pipeline.png   speed-up and busy fractions against M, with the ideal curves;
  logs/pipeline-*  every run's output and metrics (cluster.py's report included).
Needs what cluster.py --cpus needs: Linux, root, iproute2's ip and a cgroup cpu controller.
"""
import os
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, their CPU quotas and their links
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how this benchmark runs an example and reads its metrics
import command_line  # the one-line error
from example_runs import mini_batches_per_sec

EXAMPLE = "Model-Parallel-Pipeline"
WORKLOAD = ["--hidden", "1024", "--layers", "5"]  # with --batch_size 4096: seconds per step
QUICK_WORKLOAD = ["--hidden", "128", "--layers", "3"]
GOAL_M, GOAL_SPEED_UP = 4, 1.4  # the goal: M = 4 over 2 stages, 1.4x M = 1


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__)
    example_runs.add_run_flags(p, steps=20, eval_every=5)
    p.set_defaults(batch_size=4096)
    p.add_argument("--cpus", type=cluster.positive_cores, default=0.4, metavar="C",
                   help="cores of every host, a cgroup CPU quota each (default: 0.4)")
    p.add_argument("--stages", type=int, default=2, help="worker tasks, a stage each (default: 2)")
    p.add_argument("--micro_batches", default="1,2,4,8", metavar="COUNTS",
                   help="comma-separated values of M (default: 1,2,4,8)")
    p.add_argument("--quick", action="store_true",
                   help="a small model and 6 mini-batches a run: a smoke run that publishes "
                        "nothing")
    return p


def micro_batch_counts(text, batch_size):
    counts = sorted({int(t) for t in text.split(",") if t.strip()})
    if not counts or counts[0] != 1:
        raise ValueError("--micro_batches: give counts that start with 1 (the speed-ups are "
                         "against it), such as 1,2,4,8")
    uneven = [m for m in counts if batch_size % m]
    if uneven:
        raise ValueError("--micro_batches: --batch_size %d cannot be cut into %s"
                         % (batch_size, ",".join(map(str, uneven))))
    return counts


def ideal_speed_up(m, stages):
    return stages * m / (m + stages - 1)


def write_table(path, results, settings):
    stages = settings["stages"]
    one = mini_batches_per_sec(results[1])
    busy_heads = " | ".join("stage %d busy" % (k + 1) for k in range(stages))
    lines = ["| M | mini-batches/s | speed-up over M = 1 | ideal | %s | ideal busy |" % busy_heads,
             "|---" * (5 + stages) + "|"]
    for m, metrics in results.items():
        rate = mini_batches_per_sec(metrics)
        lines.append("| %d | %.2f | %.2f | %.2f | %s | %.2f |" % (
            m, rate, rate / one, ideal_speed_up(m, stages),
            " | ".join("%.2f" % b for b in metrics["stage_busy"]), m / (m + stages - 1)))
    lines.append("")
    if GOAL_M in results and stages == 2:
        speed_up = mini_batches_per_sec(results[GOAL_M]) / one
        lines.append("Goal, M = %d at least %.1f times M = 1: %s (%.2f: %.2f against %.2f "
                     "mini-batches/s)." % (GOAL_M, GOAL_SPEED_UP, "reached" if speed_up >=
                                           GOAL_SPEED_UP else "NOT reached", speed_up,
                                           mini_batches_per_sec(results[GOAL_M]), one))
        lines.append("")
    lines.append("%d stages, each a host of %g core(s) (a cgroup CPU quota of its own), links "
                 "unlimited; %s, --batch_size %d, %d mini-batches a run, a traced step every "
                 "%d; %d CPU core(s) in all. Measured with `%s`." % (
                     stages, settings["cpus"], " ".join(settings["workload"]),
                     settings["batch_size"], settings["steps"], settings["eval_every"],
                     os.cpu_count(), settings["command"]))
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def plot(path, results, stages):
    plt = example_runs.pyplot()
    counts = list(results)
    one = mini_batches_per_sec(results[1])
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    smooth = [1 + i / 10 for i in range(int((counts[-1] - 1) * 10) + 1)]
    left.plot(smooth, [ideal_speed_up(m, stages) for m in smooth], color="black", linestyle=":",
              label="ideal: K M / (M + K - 1)")
    left.plot(counts, [mini_batches_per_sec(results[m]) / one for m in counts], marker="o",
              label="measured")
    left.set_ylabel("mini-batches/s, relative to M = 1")
    right.plot(smooth, [m / (m + stages - 1) for m in smooth], color="black", linestyle=":",
               label="ideal: M / (M + K - 1)")
    for k in range(stages):
        right.plot(counts, [results[m]["stage_busy"][k] for m in counts],
                   label="stage %d" % (k + 1), **example_runs.line_style(k))
    right.set_ylabel("busy fraction of a step")
    right.set_ylim(0, 1)
    for ax in (left, right):
        ax.set_xlabel("micro-batches per mini-batch (M)")
        ax.set_xticks(counts)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle("GPipe's bubble: %d stages, each a host with a CPU quota" % stages)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None, prog="pipeline.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)
    workload = QUICK_WORKLOAD if args.quick else WORKLOAD
    if args.quick:
        args.steps, args.eval_every, args.batch_size = 6, 3, 512
    try:
        counts = micro_batch_counts(args.micro_batches, args.batch_size)
        if args.stages < 2:
            raise ValueError("--stages: a pipeline needs 2 or more")
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=False)
            cluster.check_cpus(args.stages, args.cpus)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    started, results = time.time(), {}
    for i, m in enumerate(counts, 1):
        print("[%d/%d] %s, %d stages, M = %d (%.0f s so far)" % (
            i, len(counts), EXAMPLE, args.stages, m, time.time() - started), file=sys.stderr,
            flush=True)
        results[m] = example_runs.run_example(
            EXAMPLE, args.stages, args, "pipeline-M%d" % m,
            train_args=workload + ["--micro_batches", str(m)], bandwidth="unlimited",
            cpus=args.cpus, who="pipeline")
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True), cpus=args.cpus,
                    stages=args.stages, steps=args.steps, batch_size=args.batch_size,
                    eval_every=args.eval_every, workload=workload)
    table = write_table(os.path.join(args.out, "pipeline.md"), results, settings)
    print(table)
    if example_runs.publishing(args, args.quick):
        published_tables.publish("pipeline.py", table, [published_tables.BENCHMARKS_README])
    plot(os.path.join(args.out, "pipeline.png"), results, args.stages)
    print("wrote pipeline.md and pipeline.png to %s in %.0f s" % (args.out, time.time() - started),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
