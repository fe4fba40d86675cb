"""Compare every example on the same problem: a results table and two plots.

    python benchmarks/compare.py                     # about 20 minutes on 2 cores
    python benchmarks/compare.py --quick             # few steps, one repeat, 1-2 workers
    python benchmarks/compare.py --repeats 5 --steps 4000 --out my-results
    python benchmarks/compare.py --from_logs         # redraw the last results without training
    python benchmarks/compare.py --problem mnist1d --steps 2000 --workers 2   # about 25 minutes
    python benchmarks/compare.py --problem mnist1d --steps 2000 --workers 1,2,4,8 --repeats 1 \
        --examples Hogwild,Distributed-Setup,DOWNPOUR,ADAG,DynSGD \
        --out benchmarks/results/mnist1d/workers     # the workers sweep: about 25 min
    sudo python benchmarks/compare.py --bandwidth unlimited,1gbit,100mbit,20mbit

With --bandwidth the comparison is over the network instead: every distributed example as
separate hosts behind links of each rate (benchmarks/bandwidth.py, which this hands over to).

Runs Non-Distributed-Setup and every distributed example through its own run.sh, with the same
model, batch size and training budget (--steps mini-batches in all, summed over workers), the
distributed ones with 2 workers, --repeats times each (run r with --seed SEED + r, so the range
is over seeds); then each distributed example once more with 1 and 4 workers (--workers 2 leaves
those out). --problem mnist1d trains every example on MNIST-1D instead of the digits (a harder
problem, where the schemes part ways in accuracy; benchmarks/problems.py), "seconds to" counts
to 0.55 instead of 0.95, and --out defaults to benchmarks/results/mnist1d. Writes into --out:
  results.md       the table: final test accuracy (median and range over the repeats), wall
                   time to reach 0.95 (0.55 on MNIST-1D) test accuracy, mini-batches/s and
                   examples/s (all workers), parameter updates (on the ps: global steps), and
                   the mean staleness of an update where the example measures it;
  accuracy.png     test accuracy against wall time, one line per example (first repeat);
  final_accuracy.png  final test accuracy per example: the median and the range over repeats;
  scaling.png      examples/s and final accuracy against the number of workers;
  workers.md       with more than one --workers count: each example's final test accuracy and
                   mean staleness at each count (the first repeat), what staleness costs;
  logs/            every run's output and metrics.
"""
import argparse
import os
import statistics
import sys
import time

import published_tables  # the figures reach the READMEs only through here
import command_line  # link rates and the one-line error
import example_runs  # how this benchmark runs an example and reads its metrics
import problems  # benchmarks/problems.py: the digits or MNIST-1D
from example_runs import (BASELINE, examples_per_sec, line_style, mini_batches_per_sec,
                          time_to_target)


PROBLEM_NAMES = {"digits": "the digits", "mnist1d": "MNIST-1D"}


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def write_table(path, runs, args):
    lines = ["| example | workers | test accuracy: median (min-max) | seconds to %.2f "
             "| mini-batches/s | examples/s | parameter updates | mean staleness |" % args.target,
             "|---|---|---|---|---|---|---|---|"]
    for example, repeats in runs.items():
        accuracies = [m["test_accuracy"] for m in repeats]
        reach = median_or_none([time_to_target(m, args.target) for m in repeats])
        stale = median_or_none([m.get("mean_staleness") for m in repeats])
        rate = statistics.median(mini_batches_per_sec(m) for m in repeats)
        lines.append("| %s | %d | %.3f (%.3f-%.3f) | %s | %.0f | %.0f | %d | %s |" % (
            example, repeats[0]["workers"], statistics.median(accuracies), min(accuracies),
            max(accuracies), "not reached" if reach is None else "%.1f" % reach,
            rate, rate * args.batch_size,
            statistics.median(m["global_step"] for m in repeats),
            "n/a" if stale is None else "%.2f" % stale))
    lines.append("")
    lines.append("%d repeat(s) (seeds %s) of %d mini-batches of %d examples each on %s; the "
                 "distributed examples with 2 workers (and 1 ps where they have one); %d CPU "
                 "core(s)." % (args.repeats,
                               ", ".join(str(args.seed + r) for r in range(args.repeats)),
                               args.steps, args.batch_size, PROBLEM_NAMES[args.problem],
                               os.cpu_count()))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def write_workers_table(path, scaling, worker_counts):
    """scaling: {example: {workers: metrics}} -> final test accuracy (mean staleness) per
    count."""
    lines = ["| example | " + " | ".join("%d worker(s)" % n for n in worker_counts) + " |",
             "|---|" + "---|" * len(worker_counts)]
    for example, by_workers in scaling.items():
        cells = []
        for n in worker_counts:
            m = by_workers.get(n)
            stale = m and m.get("mean_staleness")
            cells.append("" if m is None else "%.3f%s" % (
                m["test_accuracy"], "" if stale is None else " (%.2f)" % stale))
        lines.append("| %s | %s |" % (example, " | ".join(cells)))
    lines += ["", "Final test accuracy (mean staleness, where the example measures it) with each "
                  "number of workers, the same budget of mini-batches summed over the workers."]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def plot_accuracy(path, results, args):
    example_runs.plot_accuracy_against_time(
        path, [(example, repeats[0]["history"]) for example, repeats in results.items()],
        "Test accuracy against wall time on %s (same model, batch size and budget)"
        % PROBLEM_NAMES[args.problem], target=args.target)


def plot_final_accuracy(path, results, args):
    """Each example's final test accuracy: a dot at the median, a bar over the repeats' range."""
    plt = example_runs.pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(results) + 1.5))
    for i, (example, repeats) in enumerate(results.items()):
        accuracies = [m["test_accuracy"] for m in repeats]
        median = statistics.median(accuracies)
        ax.errorbar([median], [i], xerr=[[median - min(accuracies)], [max(accuracies) - median]],
                    fmt="o", color="C%d" % (i % 10), capsize=4)
    ax.set_yticks(range(len(results)))
    ax.set_yticklabels(list(results))
    ax.invert_yaxis()  # the baseline on top, as in the table
    ax.set_xlabel("final test accuracy: median and range over %d repeat(s)" % args.repeats)
    ax.set_title("%s, %d mini-batches of %d" % (PROBLEM_NAMES[args.problem], args.steps,
                                                 args.batch_size))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_scaling(path, scaling, worker_counts, target, batch_size):
    plt = example_runs.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (example, by_workers) in enumerate(scaling.items()):
        counts = [w for w in worker_counts if w in by_workers]
        left.plot(counts, [examples_per_sec(by_workers[w], batch_size) for w in counts],
                  label=example, **line_style(i))
        right.plot(counts, [by_workers[w]["test_accuracy"] for w in counts], label=example,
                   **line_style(i))
    for ax, label in ((left, "examples/s (all workers)"), (right, "final test accuracy")):
        ax.set_xlabel("workers")
        ax.set_xticks(worker_counts)
        ax.set_ylabel(label)
    right.axhline(target, color="gray", linestyle=":", linewidth=1)
    right.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("Scaling with the number of workers (1 ps; workers share the CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--bandwidth" or a.startswith("--bandwidth=") for a in argv):
        import bandwidth  # the network axis has its own table, plots and flags
        return bandwidth.main(argv, prog="compare.py")
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.splitlines()[0])
    example_runs.add_run_flags(p, problem=True)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per example, run r with --seed SEED + r (default: 3)")
    p.add_argument("--workers", default="1,2,4", help="for the scaling plot (default: 1,2,4)")
    p.add_argument("--examples", default="",
                   help="comma-separated distributed examples to run, e.g. DOWNPOUR,Sync-SGD "
                        "(default: all; the one-process baseline always runs)")
    p.add_argument("--quick", action="store_true",
                   help="120 steps, one repeat, 2 workers: a smoke test")
    p.add_argument("--bandwidth", metavar="RATES",
                   help="compare over a network instead, at each of RATES (e.g. "
                        "unlimited,1gbit,100mbit,20mbit): see benchmarks/bandwidth.py --help; "
                        "needs root (default: localhost only)")
    args = example_runs.parse_run_flags(p, argv)
    if args.quick:
        args.steps, args.repeats, args.eval_every, args.workers = 120, 1, 20, "2"
    worker_counts = [int(w) for w in args.workers.split(",")]
    try:
        names = example_runs.select_examples(args.examples)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError) as e:
        return command_line.error(str(e))
    plan = [(e, 1 if e == BASELINE else 2, r) for e in names for r in range(args.repeats)]
    plan += [(e, w, 0) for e in names if e != BASELINE for w in worker_counts if w != 2]
    results, scaling, started = {}, {}, time.time()
    for i, (example, workers, repeat) in enumerate(plan, 1):
        print("[%d/%d] %s, %d worker(s), run %d (%.0f s so far)"
              % (i, len(plan), example, workers, repeat + 1, time.time() - started),
              file=sys.stderr, flush=True)
        metrics = example_runs.run_example(example, workers, args,
                                   "%s-w%d-r%d" % (example, workers, repeat),
                                   seed=args.seed + repeat)
        if workers == (1 if example == BASELINE else 2):
            results.setdefault(example, []).append(metrics)
        if example != BASELINE and repeat == 0:
            scaling.setdefault(example, {})[workers] = metrics
    os.makedirs(args.out, exist_ok=True)
    table = write_table(os.path.join(args.out, "results.md"), results, args)
    print(table)
    if example_runs.publishing(args, args.quick, published=problems.PROBLEMS):  # the figures shown
        readmes = [published_tables.BENCHMARKS_README] + (
            [published_tables.ROOT_README] if args.problem == "digits" else [])
        published_tables.publish(example_runs.section("compare.py", args), table, readmes)
    plot_accuracy(os.path.join(args.out, "accuracy.png"), results, args)
    plot_final_accuracy(os.path.join(args.out, "final_accuracy.png"), results, args)
    plot_scaling(os.path.join(args.out, "scaling.png"), scaling, worker_counts, args.target,
                 args.batch_size)
    if len(worker_counts) > 1:
        print(write_workers_table(os.path.join(args.out, "workers.md"), scaling, worker_counts))
    print("\nwrote results.md, accuracy.png, final_accuracy.png and scaling.png to %s in %.0f s"
          % (args.out, time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
