"""The decision table: how long each scheme takes to reach a good-enough model on a cluster.

    sudo python benchmarks/decision_table.py              # the full table: see "How long" below
    sudo python benchmarks/decision_table.py --quick      # 2 examples, 1 rate, 1 repeat: smoke
    python benchmarks/decision_table.py --from_logs       # redraw from the last run's logs

The question a user choosing a scheme asks is the one MLPerf measures: seconds until the test
accuracy reaches a target, on my cluster. Every distributed example (scaling.py's selection;
--examples names others) runs with --workers workers (3) and 1 ps through benchmarks/cluster.py,
every task a host of its own: a network namespace behind links of each rate in --bandwidth
(unlimited, 100 Mbit/s and 20 Mbit/s) and a cgroup CPU quota of --cpus cores (0.4). The
reference is Non-Distributed-Setup in one process on one such host. The problem is MNIST-1D
(--problem; a problem where the schemes part ways in accuracy, see compare.py --problem
mnist1d) and the workload the scaling benchmark's, so that a mini-batch costs more to compute
than to send at the unlimited rate: --hidden 4096, --batch_size 512, --steps mini-batches in
all. The target defaults to the problem's (0.55 on MNIST-1D, where one process with the
default MLP levels off at 0.58-0.59): the table's first row says whether the reference reached
it at this workload; if it did not, lower --target.

Each cell is the median over --repeats runs (seeds SEED, SEED + 1, ...) of the seconds from the
chief's start to the target, with the runs' range; "not reached" when no run reached it within
its --steps, "k of n: S" when only some did (S their median). A run reports its seconds to the
target only when it ends: one that overruns --timeout (900 s) counts as not reached and is not
run again. At 20 Mbit/s the examples that move the whole model every mini-batch (2.5 MB at
this workload) take minutes; 600 s was too short for those that took about 150 s at 100 Mbit/s.

How long: 13 examples x 3 rates x 2 repeats = 78 runs and 2 reference runs. Measured here, one
rate at a time: unlimited links 893 s, 100 Mbit/s about 1800 s, 20 Mbit/s about 6650 s. Run
fewer rates (--bandwidth unlimited,100mbit), examples (--examples) or repeats (--repeat_from)
at a time, then draw the whole table from every run's log with --from_logs.

Writes into --out (benchmarks/results/mnist1d with --problem mnist1d):
  decision_table.md    the table, one row per example, a column per rate;
  decision_table.png   seconds to the target against the rate, one line per example, the
                       runs' range as error bars, the reference as a grey line;
  logs/decision-*      every run's output and metrics.
Needs what cluster.py --cpus needs: Linux, root, iproute2's ip and tc, a cgroup cpu controller.
"""
import os
import statistics
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, their CPU quotas and their links
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how every benchmark runs an example and reads its metrics
import scaling  # benchmarks/scaling.py: the workload, the selection, one process on one host
import command_line  # link rates and the one-line error
from example_runs import BASELINE, time_to_target


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__)
    example_runs.add_run_flags(p, steps=900, eval_every=10, problem=True)
    p.set_defaults(batch_size=512, problem="mnist1d", timeout=900)
    p.add_argument("--target", type=float, default=None,
                   help="the test accuracy to reach (default: the problem's, 0.55 on MNIST-1D)")
    p.add_argument("--cpus", type=cluster.positive_cores, default=0.4, metavar="C",
                   help="cores of every host, a cgroup CPU quota each (default: 0.4)")
    p.add_argument("--workers", type=int, default=3, help="workers per run (default: 3)")
    p.add_argument("--bandwidth", default="unlimited,100mbit,20mbit", metavar="RATES",
                   help="comma-separated link rates (default: unlimited,100mbit,20mbit)")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs per example and rate, run r with --seed SEED + r (default: 2)")
    p.add_argument("--repeat_from", type=int, default=0, metavar="R",
                   help="run only runs R to --repeats - 1 (a table measured in parts: the "
                        "runs before R are left as they are, for --from_logs; default: 0)")
    p.add_argument("--examples", default="",
                   help="comma-separated distributed examples (default: scaling.py's)")
    p.add_argument("--quick", action="store_true",
                   help="DOWNPOUR and Sync-SGD, unlimited links, 1 repeat, 60 steps: a smoke "
                        "run that publishes nothing")
    return p


def cell(seconds):
    """The runs' seconds to the target (None: not reached) -> the table's text."""
    reached = sorted(s for s in seconds if s is not None)
    if not reached:
        return "not reached"
    if len(reached) < len(seconds):
        return "%d of %d: %.1f" % (len(reached), len(seconds), statistics.median(reached))
    if len(reached) == 1:
        return "%.1f" % reached[0]
    return "%.1f (%.1f-%.1f)" % (statistics.median(reached), reached[0], reached[-1])


def seconds_to(metrics_list, target):
    """Each run's seconds to target; a run that overran its timeout (None) did not reach it."""
    return [None if m is None else time_to_target(m, target) for m in metrics_list]


def write_table(path, results, reference, rates, settings):
    """results: {(example, rate label): [metrics or None per repeat]}; reference: [metrics per
    repeat] of one process on one host; rates: [(label, bits)]."""
    target = settings["target"]
    lines = ["| example | " + " | ".join("s to %.2f, %s" % (target, command_line.format_rate(bits))
                                         for _, bits in rates) + " |",
             "|---|" + "---|" * len(rates)]
    one_host = cell(seconds_to(reference, target))
    lines.append("| %s (one process, one host) | %s |" % (
        BASELINE, " | ".join([one_host] * len(rates))))
    for example in dict.fromkeys(e for e, _ in results):
        lines.append("| %s | %s |" % (example, " | ".join(
            cell(seconds_to(results[(example, label)], target)) for label, _ in rates)))
    lines += ["", "Each cell: the median (and range) over %d run(s) of the seconds from the "
              "chief's start to %.2f test accuracy on %s; %d workers and 1 ps, every host %g "
              "core(s) (a cgroup CPU quota of its own); --hidden 4096, --batch_size %d, %d "
              "mini-batches a run; %d CPU core(s) in all. Measured with `%s`."
              % (settings["repeats"], target, settings["problem"], settings["workers"],
                 settings["cpus"], settings["batch_size"], settings["steps"], os.cpu_count(),
                 settings["command"])]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def which_scheme(results, reference, rates, settings):
    """The table read for a user choosing a scheme (the root README's "Which scheme when"): for
    each rate, the three examples that reached the target first (median seconds, and how many
    times faster than one process on one host; those that reached it in every run before those
    that reached it in some), those slower than one host, and those that did not reach it."""
    target = settings["target"]
    one_host = [s for s in seconds_to(reference, target) if s is not None]
    one_host = statistics.median(one_host) if one_host else None
    lines = ["| links | first to %.2f (median s, speed-up against one host) | slower than one "
             "host | not reached in %d mini-batches |" % (target, settings["steps"]),
             "|---|---|---|---|"]
    for label, bits in rates:
        timed, missed = [], []
        for example in dict.fromkeys(e for e, _ in results):
            seconds = seconds_to(results.get((example, label), []), target)
            reached = [s for s in seconds if s is not None]
            if reached:
                timed.append((statistics.median(reached), example, len(reached), len(seconds)))
            elif seconds:
                missed.append(example)
        timed.sort(key=lambda t: (t[2] < t[3], t[0]))  # every run reached it, then the seconds
        slower = [example for median, example, _, _ in timed if one_host and median > one_host]
        first = []
        for median, example, k, n in timed[:3]:
            text = "%s %.1f s" % (example, median)
            if one_host:
                text += " (%.1fx)" % (one_host / median)
            if k < n:
                text += ", %d of %d runs" % (k, n)
            first.append(text)
        lines.append("| %s | %s | %s | %s |" % (command_line.format_rate(bits),
                                                 "; ".join(first) or "none",
                                                 ", ".join(slower) or "none",
                                                 ", ".join(missed) or "none"))
    lines += ["", "One process on one host: %s. Read from the decision table (%d workers and 1 ps "
              "on hosts of %g core(s), %s, %d run(s) a cell), written by `%s`."
              % ("%.1f s to %.2f" % (one_host, target) if one_host else "not reached",
                 settings["workers"], settings["cpus"], settings["problem"], settings["repeats"],
                 settings["command"])]
    return "\n".join(lines)


def plot(path, results, reference, rates, target):
    plt = example_runs.pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    positions = list(range(len(rates)))
    for i, example in enumerate(dict.fromkeys(e for e, _ in results)):
        xs, medians, below, above = [], [], [], []
        for x, (label, _) in zip(positions, rates):
            reached = sorted(s for s in seconds_to(results[(example, label)], target) if s)
            if reached:
                median = statistics.median(reached)
                xs.append(x)
                medians.append(median)
                below.append(median - reached[0])
                above.append(reached[-1] - median)
        if xs:
            ax.errorbar(xs, medians, yerr=[below, above], label=example, capsize=3,
                        **example_runs.line_style(i))
    reached = sorted(s for s in seconds_to(reference, target) if s)
    if reached:
        ax.axhline(statistics.median(reached), color="gray", linestyle=":", linewidth=2,
                   label="%s, one host" % BASELINE)
    ax.set_xticks(positions)
    ax.set_xticklabels([command_line.format_rate(bits) for _, bits in rates])
    ax.set_xlabel("link rate")
    ax.set_yscale("log")
    ax.set_ylabel("seconds to %.2f test accuracy (median, range; log scale)" % target)
    if ax.get_legend_handles_labels()[0]:  # nothing to show where no run reached the target
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None, prog="decision_table.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)  # --target, or the problem's
    if args.quick:
        args.examples, args.bandwidth, args.repeats, args.steps = "DOWNPOUR,Sync-SGD", \
            "unlimited", 1, 60
    try:
        rates = command_line.parse_rates(args.bandwidth)
        names = [e for e in example_runs.select_examples(args.examples) if e != BASELINE
                 and (e not in scaling.LEFT_OUT or args.examples)]
        if not names:
            raise ValueError("--examples: name at least one distributed example")
        if args.workers < 1 or args.repeats < 1:
            raise ValueError("--workers and --repeats must be at least 1")
        if not 0 <= args.repeat_from < args.repeats:
            raise ValueError("--repeat_from %d: give a run from 0 to --repeats - 1 (%d)"
                             % (args.repeat_from, args.repeats - 1))
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=any(bits is not None for _, bits in rates))
            cluster.check_cpus(args.workers + 2, args.cpus)  # the workers, a ps, a coordinator
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    who = os.path.splitext(prog)[0]
    first = 0 if args.from_logs else args.repeat_from  # a redraw reads every run's log
    runs = range(first, args.repeats)
    plan = [(e, label, r) for label, _ in rates for e in names for r in runs]
    started = time.time()
    progress = lambda i, what: print("[%d/%d] %s (%.0f s so far)" % (
        i, len(plan) + len(runs), what, time.time() - started), file=sys.stderr, flush=True)
    reference = []
    for i, r in enumerate(runs, 1):
        progress(i, "%s, one process on one host of %g cores, run %d" % (BASELINE, args.cpus,
                                                                            r + 1))
        reference.append(scaling.run_baseline(args, who, tag="decision-%s-r%d" % (BASELINE, r),
                                               seed=args.seed + r))
    results = {}
    for i, (example, label, r) in enumerate(plan, len(runs) + 1):
        progress(i, "%s, %d workers, links %s, run %d" % (example, args.workers, label, r + 1))
        results.setdefault((example, label), []).append(example_runs.run_example(
            example, args.workers, args, "decision-%s-%s-r%d" % (example, label, r),
            train_args=scaling.WORKLOAD, bandwidth=label, cpus=args.cpus, who=who,
            seed=args.seed + r, timeout_is_a_result=True))
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True), target=args.target,
                    repeats=len(runs), problem=args.problem, workers=args.workers,
                    cpus=args.cpus, batch_size=args.batch_size, steps=args.steps)
    table = write_table(os.path.join(args.out, "decision_table.md"), results, reference, rates,
                        settings)
    print(table)
    reading = which_scheme(results, reference, rates, settings)
    print("\n" + reading)
    if example_runs.publishing(args, args.quick, published=("mnist1d",)):
        published_tables.publish(example_runs.section("decision_table.py", args), table,
                                 [published_tables.BENCHMARKS_README])
        published_tables.publish(example_runs.section("decision_table.py", args) + "-reading",
                                 reading, [published_tables.ROOT_README])
    plot(os.path.join(args.out, "decision_table.png"), results, reference, rates, args.target)
    print("\nwrote decision_table.md and decision_table.png to %s in %.0f s"
          % (args.out, time.time() - started), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
