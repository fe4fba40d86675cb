"""Every distributed example over links of several bandwidths: when each algorithm pays.

    sudo python benchmarks/compare.py --bandwidth unlimited,1gbit,100mbit,20mbit
    sudo python benchmarks/compare.py --bandwidth unlimited,20mbit --examples DOWNPOUR,Sync-SGD
    sudo python benchmarks/compare.py --bandwidth unlimited,20mbit --quick   # a smoke run
    python benchmarks/compare.py --bandwidth unlimited,20mbit --from_logs    # redraw, no training

(compare.py --bandwidth hands over to this script; `python benchmarks/bandwidth.py` takes the
same flags and defaults to the four rates above.) On localhost a message costs a fixed small
time whatever its size, so the examples differ only in how many messages they send. Here
every distributed example runs through benchmarks/cluster.py once per rate: each ps, worker
and coordinator a host of its own, every link limited to the rate both ways, --workers workers,
and compare.py's --steps, --batch_size, --seed and --eval_every. The one-process baseline
(Non-Distributed-Setup) uses no network: it runs once, through its run.sh, as the reference.

Writes into --out:
  bandwidth.md               one row per example: mini-batches/s (all workers) at each rate,
                             bytes per mini-batch, and at the slowest rate the fraction of the
                             bandwidth bound reached, the seconds to 0.95 test accuracy and the
                             rank of the example by each;
  bandwidth.png              mini-batches/s against the bandwidth, one line per example, the
                             baseline flat;
  accuracy_slow_network.png  test accuracy against wall time at the slowest rate;
  logs/bandwidth-*           every run's output and metrics (cluster.py's report included).

The bandwidth bound is cluster.py's: the most mini-batches a second the busiest link allows,
were it busy all the time (its bytes, in its busier direction, over its rate). An example near
its bound is limited by the network and gains only by sending less; one far below it is
limited by something else (latency, computation, waiting for other workers). Needs what
cluster.py needs: root and iproute2's ip (and tc for a limited rate).
"""
import os
import statistics
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, the rates and the bound
import command_line  # link rates and the one-line error
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how this benchmark runs an example and reads its metrics
from example_runs import BASELINE, TARGET, mini_batches_per_sec, time_to_target

DEFAULT_RATES = "unlimited,1gbit,100mbit,20mbit"


def rank(values, higher_is_better):
    """{name: value or None} -> {name: rank or None}: 1 for the best, ties share a rank (1, 2,
    2, 4), and a name without a value (never reached the bar) has no rank."""
    known = {n: v for n, v in values.items() if v is not None}
    better = (lambda a, b: a > b) if higher_is_better else (lambda a, b: a < b)
    ranks = {n: 1 + sum(better(w, v) for w in known.values()) for n, v in known.items()}
    return {n: ranks.get(n) for n in values}


def per_second(value):
    return "%.0f" % value if value >= 100 else "%.1f" % value


def seconds(value):
    return "not reached" if value is None else "%.1f" % value


def median_bytes_per_mini_batch(by_rate):
    return statistics.median(m["cluster"]["bytes_per_mini_batch"] for m in by_rate.values())


def write_table(path, results, baseline, rates, settings):
    """results: {example: {rate label: metrics}}; baseline: the one-process run's metrics;
    settings: what the last line states (command, workers, steps, batch_size). The distributed
    examples come ranked by their time to the target (the problem's, TARGET on the digits) at
    the slowest rate."""
    target = settings.get("target", TARGET)
    slowest = rates[-1][0]
    slow = {example: by_rate[slowest] for example, by_rate in results.items()}
    reach = {example: time_to_target(m, target) for example, m in slow.items()}
    speed = {example: mini_batches_per_sec(m) for example, m in slow.items()}
    by_time, by_speed = rank(reach, higher_is_better=False), rank(speed, higher_is_better=True)
    at = command_line.format_rate(rates[-1][1])
    columns = (["example"] + ["mini-batches/s, %s" % command_line.format_rate(b) for _, b in rates]
               + ["kB per mini-batch", "fraction of the bound, " + at,
                  "seconds to %.2f, %s" % (target, at), "rank by time to %.2f, %s" % (target, at),
                  "rank by mini-batches/s, " + at])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    base_reach = time_to_target(baseline, target)
    lines.append("| " + " | ".join(
        ["%s (one process)" % BASELINE] + [per_second(mini_batches_per_sec(baseline))] * len(rates)
        + ["none", "n/a", seconds(base_reach), "reference", "reference"]) + " |")
    order = sorted(results, key=lambda e: (by_time[e] is None, by_time[e] or 0, by_speed[e], e))
    for example in order:
        by_rate, report = results[example], slow[example]["cluster"]
        fraction = report.get("fraction_of_bound")
        lines.append("| " + " | ".join(
            [example] + [per_second(mini_batches_per_sec(by_rate[label])) for label, _ in rates]
            + ["%.1f" % (median_bytes_per_mini_batch(by_rate) / 1e3),
               "n/a" if fraction is None else "%.2f" % fraction, seconds(reach[example]),
               "-" if by_time[example] is None else str(by_time[example]),
               str(by_speed[example])]) + " |")
    lines += ["", "mini-batches/s: all workers' mini-batches a second with every link at that "
                  "rate; bytes: all hosts' sent bytes over the mini-batches (median over the "
                  "rates); the bound: cluster.py's, the busiest link's bytes over its rate. "
                  "%s has no network: it ran once and stands in every column." % BASELINE,
              "",
              "`%s`: %d workers (and 1 ps where the example has one, and "
              "ParameterServerStrategy's coordinator), %d mini-batches of %d examples each, "
              "every task a host of its own on one machine with %d CPU core(s)."
              % (settings["command"], settings["workers"], settings["steps"],
                 settings["batch_size"], os.cpu_count())]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def plot_positions(rates):
    """Where each rate goes on a log axis: its bits per second; unlimited a decade beyond the
    fastest limited rate (or at 10 Gbit/s), labelled as such."""
    limited = [b for _, b in rates if b is not None]
    unlimited_at = 10 * max(limited) if limited else 10 ** 10
    return [unlimited_at if b is None else b for _, b in rates]


def plot_bandwidth(path, results, baseline, rates):
    plt = example_runs.pyplot()
    fig, ax = plt.subplots(figsize=(11, 5.5))
    xs = plot_positions(rates)
    for i, (example, by_rate) in enumerate(results.items()):
        ax.plot(xs, [mini_batches_per_sec(by_rate[label]) for label, _ in rates], label=example,
                **example_runs.line_style(i))
    ax.axhline(mini_batches_per_sec(baseline), color="gray", linestyle="--", linewidth=1.5,
               label="%s (one process, no network)" % BASELINE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([command_line.format_rate(b) for _, b in rates])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.yaxis.set_major_locator(plt.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: "%g" % y))
    ax.yaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("bandwidth of every link (each way)")
    ax.set_ylabel("mini-batches/s (all workers)")
    ax.set_title("Throughput against bandwidth (every task a host of its own)")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_accuracy(path, results, baseline, rate, target=TARGET):
    label, bits = rate
    example_runs.plot_accuracy_against_time(
        path, [(example, by_rate[label]["history"]) for example, by_rate in results.items()],
        "Test accuracy against wall time, every link at %s" % command_line.format_rate(bits),
        reference=("%s (one process, no network)" % BASELINE, baseline["history"]),
        target=target)


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__, "python benchmarks/bandwidth.py --help")
    example_runs.add_run_flags(p, problem=True)
    p.add_argument("--bandwidth", default=DEFAULT_RATES, metavar="RATES",
                   help="comma-separated link rates in tc's units, or unlimited (default: %s)"
                        % DEFAULT_RATES)
    p.add_argument("--workers", type=int, default=2, help="workers per run (default: 2)")
    p.add_argument("--examples", default="",
                   help="comma-separated distributed examples, e.g. DOWNPOUR,Sync-SGD (default: "
                        "all; the one-process baseline always runs)")
    p.add_argument("--quick", action="store_true",
                   help="300 steps, test accuracy every 20: a smoke run that publishes nothing")
    return p


def main(argv=None, prog="bandwidth.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)
    if args.quick:
        args.steps, args.eval_every = 300, 20
    try:
        rates = command_line.parse_rates(args.bandwidth)
        names = example_runs.select_examples(args.examples)
        if names == [BASELINE]:
            raise ValueError("--examples: name at least one distributed example")
        if args.workers < 1:
            raise ValueError("--workers must be at least 1, got %d" % args.workers)
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=any(bits is not None for _, bits in rates))
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    distributed, who = [e for e in names if e != BASELINE], os.path.splitext(prog)[0]
    plan = [(e, label) for e in distributed for label, _ in rates]
    started = time.time()
    progress = lambda i, what: print("[%d/%d] %s (%.0f s so far)" % (
        i, len(plan) + 1, what, time.time() - started), file=sys.stderr, flush=True)
    progress(1, "%s, one process, no network" % BASELINE)
    baseline = example_runs.run_example(BASELINE, 1, args, "bandwidth-%s" % BASELINE, who=who)
    results = {}
    for i, (example, label) in enumerate(plan, 2):
        progress(i, "%s, %d workers, links %s" % (example, args.workers, label))
        results.setdefault(example, {})[label] = example_runs.run_example(
            example, args.workers, args, "bandwidth-%s-%s" % (example, label),
            bandwidth=label, who=who)
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True), workers=args.workers,
                    steps=args.steps, batch_size=args.batch_size, target=args.target)
    table = write_table(os.path.join(args.out, "bandwidth.md"), results, baseline, rates,
                        settings)
    print(table)
    if example_runs.publishing(args, args.quick):
        published_tables.publish("bandwidth.py", table, [published_tables.BENCHMARKS_README])
    plot_bandwidth(os.path.join(args.out, "bandwidth.png"), results, baseline, rates)
    plot_accuracy(os.path.join(args.out, "accuracy_slow_network.png"), results, baseline,
                  rates[-1], args.target)
    print("\nwrote bandwidth.md, bandwidth.png and accuracy_slow_network.png to %s in %.0f s"
          % (args.out, time.time() - started), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
