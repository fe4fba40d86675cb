"""DOWNPOUR and ADAG as the window grows: what a longer window costs each in accuracy.

    python benchmarks/window_sweep.py                             # localhost
    sudo python benchmarks/window_sweep.py --bandwidth 20mbit     # every task a host of its own
    python benchmarks/window_sweep.py --quick                     # windows 1 and 4: a smoke run
    python benchmarks/window_sweep.py --problem mnist1d --steps 2000 \
        --examples DOWNPOUR,ADAG,DynSGD,EASGD,EAMSGD,AEASGD,DiLoCo   # MNIST-1D, about 11 min

The last runs every windowed, elastic and DiLoCo example at windows 1 to 32 with 4 workers on
MNIST-1D: 42 runs of about 16 s each on 2 shared cores.

Both examples train a local copy for a window of mini-batches between two exchanges with the
ps, so a longer window sends less; they differ in what a push is. DOWNPOUR pushes the window's
summed gradients and the ps applies all of it (here with plain SGD at the workers' learning
rate, --ps_optimizer sgd --ps_learning_rate LR, so that the push is the only difference); ADAG
pushes the window's mean update, the sum divided by the window. At a window of 1 the two are
the same algorithm. The rate defaults to ADAG's own, 0.5, at which DOWNPOUR with a window of 1
trains as well as ADAG. Each window in --windows runs once per example with --workers workers,
the same --learning_rate for both and compare.py's --steps, --batch_size, --seed and
--eval_every: through run.sh on localhost, or with --bandwidth RATE through
benchmarks/cluster.py, each task a host of its own behind links of that rate.

Writes into --out:
  window_sweep.md    one row per example and window: final test accuracy, seconds to the
                     problem's target (or not reached), mini-batches/s (all workers), pushes
                     per worker (and with --bandwidth, bytes per mini-batch);
  window_sweep.png   final test accuracy and mini-batches/s against the window, both examples;
  logs/window_sweep-*  every run's output and metrics.

References: J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (Downpour SGD);
J. Hermans, G. Spanakis, R. Wiggers, "Accumulated Gradient Normalization", ACML 2017,
arXiv:1710.02368 (ADAG/AGN; its experiments vary the window as well).
"""
import os
import sys
import time

import cluster  # benchmarks/cluster.py: rates, and what a machine needs for --bandwidth
import command_line  # link rates and the one-line error
import problems  # --problem: the digits or MNIST-1D
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how this benchmark runs an example and reads its metrics
from example_runs import TARGET, mini_batches_per_sec, time_to_target

EXAMPLES = ("DOWNPOUR", "ADAG")  # the default, and the published digits table
# every example with a --window: local steps between two exchanges with the ps (DiLoCo: inner
# steps per round); those beyond DOWNPOUR and ADAG train at their own learning rates
WINDOWED = EXAMPLES + ("DynSGD", "EASGD", "EAMSGD", "AEASGD", "DiLoCo")


def train_args(example, window, learning_rate):
    """The flags that make DOWNPOUR and ADAG differ only in what a push is; the others get
    only the window."""
    if example not in EXAMPLES:
        return ["--window", str(window)]
    args = ["--window", str(window), "--learning_rate", repr(learning_rate)]
    if example == "DOWNPOUR":  # the ps applies the summed gradients at the same rate
        args += ["--ps_optimizer", "sgd", "--ps_learning_rate", repr(learning_rate)]
    return args


def pushes_per_worker(metrics):
    """The global step counts pushes, or rounds where a round takes one push from each of
    replicas_to_aggregate workers (EASGD, DiLoCo): the mean number each worker sent."""
    return metrics["global_step"] * metrics.get("replicas_to_aggregate", 1) / metrics["workers"]


def parse_windows(text):
    try:
        windows = sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        raise ValueError("--windows: give whole numbers, e.g. 1,2,4,8,16,32; got %r" % text)
    if not windows or windows[0] < 1:
        raise ValueError("--windows: give windows of at least 1, e.g. 1,2,4,8,16,32")
    return windows


def write_table(path, results, windows, settings):
    """results: {example: {window: metrics}}; settings: what the last line states."""
    on_network = settings["bandwidth"] is not None
    target = settings.get("target", TARGET)  # the problem's (example_runs.TARGETS)
    columns = ["example", "window", "final test accuracy", "seconds to %.2f" % target,
               "mini-batches/s", "pushes per worker"] + ["kB per mini-batch"] * on_network
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for example, by_window in results.items():
        for window in windows:
            m = by_window[window]
            reach = time_to_target(m, target)
            cells = [example, str(window), "%.3f" % m["test_accuracy"],
                     "not reached" if reach is None else "%.1f" % reach,
                     "%.0f" % mini_batches_per_sec(m), "%.0f" % pushes_per_worker(m)]
            if on_network:
                cells.append("%.1f" % (m["cluster"]["bytes_per_mini_batch"] / 1e3))
            lines.append("| " + " | ".join(cells) + " |")
    where = ("every task a host of its own, links at %s" % settings["bandwidth"]
             if on_network else "on localhost")
    lines += ["", "`%s`: %d workers and 1 ps, %s; learning rate %g for both (DOWNPOUR's ps: "
                  "SGD at the same rate), %d mini-batches of %d examples each, on one machine "
                  "with %d CPU core(s)."
              % (settings["command"], settings["workers"], where, settings["learning_rate"],
                 settings["steps"], settings["batch_size"], os.cpu_count())]
    others = [e for e in results if e not in EXAMPLES]
    if others:
        lines[-1] += " %s: their own learning rates." % ", ".join(others)
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def plot(path, results, windows, settings):
    plt = example_runs.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for example, by_window in results.items():
        left.plot(windows, [by_window[w]["test_accuracy"] for w in windows], marker="o",
                  label=example)
        right.plot(windows, [mini_batches_per_sec(by_window[w]) for w in windows], marker="o",
                   label=example)
    for ax, label in ((left, "final test accuracy"), (right, "mini-batches/s (all workers)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(windows)
        ax.set_xticklabels([str(w) for w in windows])
        ax.minorticks_off()
        ax.set_xlabel("window (local mini-batches between two pushes)")
        ax.set_ylabel(label)
    left.axhline(settings.get("target", TARGET), color="gray", linestyle=":", linewidth=1)
    left.legend()
    names = ", ".join(results) if len(results) <= 3 else "%d examples" % len(results)
    fig.suptitle("%s, %d workers, learning rate %g (DOWNPOUR, SGD ps; ADAG), %s" % (
        names, settings["workers"], settings["learning_rate"],
        "links at " + settings["bandwidth"]
        if settings["bandwidth"] else "localhost"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = example_runs.argparse_for("window_sweep.py", __doc__)
    example_runs.add_run_flags(p, problem=True)
    p.add_argument("--windows", default="1,2,4,8,16,32",
                   help="the windows to run (default: 1,2,4,8,16,32)")
    p.add_argument("--workers", type=int, default=4, help="workers per run (default: 4)")
    p.add_argument("--examples", default=",".join(EXAMPLES),
                   help="comma-separated, from %s (default: %s)"
                        % (",".join(WINDOWED), ",".join(EXAMPLES)))
    p.add_argument("--learning_rate", type=float, default=0.5,
                   help="the workers' learning rate in both examples, and DOWNPOUR's ps's "
                        "(default: 0.5, ADAG's own)")
    p.add_argument("--bandwidth", default=None, metavar="RATE",
                   help="run through cluster.py with every link at RATE (20mbit, unlimited); "
                        "needs root (default: localhost, through run.sh)")
    p.add_argument("--quick", action="store_true",
                   help="windows 1 and 4, 300 steps: a smoke run that publishes nothing")
    args = example_runs.parse_run_flags(p, argv)
    if args.quick:
        args.windows, args.steps, args.eval_every = "1,4", 300, 20
    try:
        windows = parse_windows(args.windows)
        examples = [e.strip() for e in args.examples.split(",") if e.strip()]
        unknown = [e for e in examples if e not in WINDOWED]
        if unknown or not examples:
            raise ValueError("--examples: choose from %s; got %r"
                             % (",".join(WINDOWED), args.examples))
        if args.workers < 1:
            raise ValueError("--workers must be at least 1, got %d" % args.workers)
        if args.bandwidth is not None:
            args.bandwidth = args.bandwidth.strip().lower()
            rate = command_line.link_rate(args.bandwidth)
            if not args.from_logs:  # before any run: a machine that cannot fails in one line
                cluster.check_machine(needs_tc=rate is not None)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    plan = [(example, window) for example in examples for window in windows]
    results, started = {}, time.time()
    for i, (example, window) in enumerate(plan, 1):
        print("[%d/%d] %s, window %d, %d workers (%.0f s so far)" % (
            i, len(plan), example, window, args.workers, time.time() - started),
            file=sys.stderr, flush=True)
        tag = "window_sweep-%s-window%d%s" % (example, window,
                                             "-" + args.bandwidth if args.bandwidth else "")
        results.setdefault(example, {})[window] = example_runs.run_example(
            example, args.workers, args, tag, train_args(example, window, args.learning_rate),
            bandwidth=args.bandwidth, who="window_sweep")
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command("window_sweep.py", argv,
                                              sudo=args.bandwidth is not None),
                    workers=args.workers, learning_rate=args.learning_rate, steps=args.steps,
                    batch_size=args.batch_size, target=args.target,
                    bandwidth=None if args.bandwidth is None else command_line.format_rate(rate))
    table = write_table(os.path.join(args.out, "window_sweep.md"), results, windows, settings)
    print(table)
    if example_runs.publishing(args, args.quick, published=problems.PROBLEMS):
        published_tables.publish(example_runs.section("window_sweep.py", args), table,
                                 [published_tables.BENCHMARKS_README])
    plot(os.path.join(args.out, "window_sweep.png"), results, windows, settings)
    print("\nwrote window_sweep.md and window_sweep.png to %s in %.0f s"
          % (args.out, time.time() - started), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
