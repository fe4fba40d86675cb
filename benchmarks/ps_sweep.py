"""How many parameter servers per worker: 3 workers with 1, 2 and 3 ps, each task a host of its
own, the variables placed whole or cut into a slice per ps.

    sudo python benchmarks/ps_sweep.py                                   # the published run
    sudo python benchmarks/ps_sweep.py --examples Sync-SGD --ps 1,3 --bandwidth 20mbit
    python benchmarks/ps_sweep.py --from_logs                            # redraw, no training

With one ps, every byte a worker pulls or pushes crosses the ps's one link and is served by the
ps's one CPU; a second ps can take half of both, but only if it holds half of the bytes.
`replica_device_setter` places whole variables round robin over the ps, and in this model one
matrix (64 inputs x 4096 hidden units: 85% of the 1.2 MB) holds most of the bytes, so a ps
count alone changes little. `--shard_variables` (Distributed-Setup, Sync-SGD) cuts every variable into
a slice per ps (a fixed-size partitioner), so that each ps link carries its share. Every run
goes through benchmarks/cluster.py: every task a network namespace with a link of each rate of
--bandwidth (1 Gbit/s, then 100 Mbit/s, by default) and a cgroup CPU quota of --cpus cores (by default the machine's cores
shared evenly by the most hosts a run needs: 3 workers and 3 ps on 2 cores is 0.33 each).
The workload is scaling.py's (--hidden 4096, --batch_size 512), where computing a mini-batch
costs more than sending it; --batch_size 128 makes the messages weigh more.

Writes into --out:
  ps_sweep.md      one row per example, link rate, ps count and placement: mini-batches/s, the speed-up
                   over 1 ps, each ps link's bytes per mini-batch (sent + received), the
                   busiest link's use of its bandwidth, each ps's CPU seconds;
  ps_sweep.png     mini-batches/s against the ps count, one line per example and placement, one
                   panel per link rate;
  logs/ps_sweep-*  every run's output and metrics.
Needs what cluster.py --cpus needs: Linux, root, iproute2's ip and tc, a cgroup cpu controller.
"""
import os
import statistics
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, their CPU quotas and their links
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how this benchmark runs an example and reads its metrics
import command_line  # link rates and the one-line error
from example_runs import mini_batches_per_sec

WORKLOAD = ["--hidden", "4096"]  # scaling.py's: with --batch_size 512 computation outweighs bytes
SHARDABLE = ("Distributed-Setup", "Sync-SGD")  # the examples with --shard_variables


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__)
    example_runs.add_run_flags(p, steps=300, eval_every=30)
    p.set_defaults(batch_size=512)
    p.add_argument("--examples", default=",".join(SHARDABLE),
                   help="comma-separated, of %s (default: both)" % ", ".join(SHARDABLE))
    p.add_argument("--ps", default="1,2,3", metavar="COUNTS",
                   help="comma-separated ps counts (default: 1,2,3)")
    p.add_argument("--workers", type=int, default=3, help="(default: 3)")
    p.add_argument("--bandwidth", default="1gbit,100mbit", metavar="RATES",
                   help="comma-separated link rates in tc's units, or unlimited "
                        "(default: 1gbit,100mbit)")
    p.add_argument("--cpus", type=cluster.positive_cores, default=None, metavar="C",
                   help="cores of every host, a cgroup CPU quota each (default: the machine's "
                        "cores over the most hosts a run needs, to two decimals)")
    return p


def ps_counts(text):
    counts = sorted({int(t) for t in text.split(",") if t.strip()})
    if not counts or counts[0] < 1:
        raise ValueError("--ps: give counts of 1 or more, such as 1,2,3")
    return counts


def plan_runs(examples, counts, labels):
    """(example, ps, sharded, link rate) for every run: one ps is the same placed whole or
    sliced, so it runs once; more ps run both ways, to show what slicing adds."""
    return [(e, n, sharded, label) for label in labels for e in examples for n in counts
            for sharded in ((False,) if n == 1 else (False, True))]


def ps_links(metrics):
    """Each ps's bytes on its link (sent + received), from cluster.py's report, in ps order."""
    hosts = metrics.get("cluster", {}).get("hosts", {})
    names = sorted((h for h in hosts if h.startswith("ps")), key=lambda h: int(h[2:]))
    return [hosts[h]["sent_bytes"] + hosts[h]["received_bytes"] for h in names]


def write_table(path, results, settings):
    lines = ["| example | links | ps | variables | mini-batches/s | vs 1 ps | kB per mini-batch on "
             "each ps link | busiest link's use of its bandwidth | CPU seconds of each ps |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (example, ps, sharded, label), metrics in results.items():
        one_ps = results.get((example, 1, False, label))
        mini_batches = metrics.get("cluster", {}).get("mini_batches") or 1
        report = metrics.get("cluster", {})
        cpu = [report.get("cpu_seconds_ps%d" % i) for i in range(ps)]
        lines.append("| %s | %s | %d | %s | %.1f | %s | %s | %s | %s |" % (
            example, label, ps, "a slice per ps" if sharded else "whole",
            mini_batches_per_sec(metrics),
            "%.2f" % (mini_batches_per_sec(metrics) / mini_batches_per_sec(one_ps))
            if one_ps else "n/a",
            " / ".join("%.0f" % (b / 1e3 / mini_batches) for b in ps_links(metrics)),
            "%.2f" % report["fraction_of_bound"] if "fraction_of_bound" in report else "n/a",
            " / ".join("%.1f" % c for c in cpu if c is not None) or "n/a"))
    lines += ["", "%d workers; every host %g core(s) (a cgroup CPU quota of its own); "
              "--hidden 4096, --batch_size %d, %d mini-batches a run; %d CPU core(s) in all. "
              "Measured with `%s`." % (settings["workers"], settings["cpus"],
                                       settings["batch_size"],
                                       settings["steps"], os.cpu_count(), settings["command"])]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def plot(path, results, counts, labels):
    plt = example_runs.pyplot()
    figure, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels) + 3, 5), squeeze=False)
    lines = sorted({(e, s) for e, _, s, _ in results})
    for ax, label in zip(axes[0], labels):
        for i, (example, sharded) in enumerate(lines):
            keys = [(example, n, sharded if n > 1 else False, label) for n in counts]
            xs = [n for n, key in zip(counts, keys) if key in results]
            ys = [mini_batches_per_sec(results[key]) for key in keys if key in results]
            ax.plot(xs, ys, label="%s, %s" % (example, "a slice per ps" if sharded else "whole"),
                    **example_runs.line_style(i))
        ax.set_title("links: %s" % label)
        ax.set_xlabel("parameter servers (hosts of their own)")
        ax.set_xticks(counts)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("mini-batches/s, all workers")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None, prog="ps_sweep.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)
    try:
        counts = ps_counts(args.ps)
        examples = [e.strip() for e in args.examples.split(",") if e.strip()]
        unknown = [e for e in examples if e not in SHARDABLE]
        if unknown or not examples:
            raise ValueError("--examples: choose from %s (the examples with --shard_variables)"
                             % ",".join(SHARDABLE))
        if args.workers < 1:
            raise ValueError("--workers: give 1 or more")
        rates = command_line.parse_rates(args.bandwidth)
        hosts = args.workers + max(counts)
        if args.cpus is None:
            args.cpus = int(100 * os.cpu_count() / hosts) / 100.0
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=any(bits is not None for _, bits in rates))
            cluster.check_cpus(hosts, args.cpus)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    who = os.path.splitext(prog)[0]
    labels = [label for label, _ in rates]
    plan = plan_runs(examples, counts, labels)
    started = time.time()
    results = {}
    for i, (example, ps, sharded, label) in enumerate(plan, 1):
        print("[%d/%d] %s, links %s, %d ps, variables %s (%.0f s so far)" % (
            i, len(plan), example, label, ps, "in slices" if sharded else "whole",
            time.time() - started), file=sys.stderr, flush=True)
        results[(example, ps, sharded, label)] = example_runs.run_example(
            example, args.workers, args, "ps_sweep-%s-%dps-%s-%s" % (
                example, ps, "sliced" if sharded else "whole", label),
            train_args=WORKLOAD + (["--shard_variables"] if sharded else []),
            bandwidth=label, cpus=args.cpus, ps=ps, who=who)
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True), cpus=args.cpus,
                    steps=args.steps, batch_size=args.batch_size,
                    workers=args.workers)
    table = write_table(os.path.join(args.out, "ps_sweep.md"), results, settings)
    print(table)
    if example_runs.publishing(args, False):
        published_tables.publish("ps_sweep.py", table, [published_tables.BENCHMARKS_README])
    plot(os.path.join(args.out, "ps_sweep.png"), results, counts, labels)
    for label in labels:
        gains = [mini_batches_per_sec(m) / mini_batches_per_sec(results[(e, 1, False, label)])
                 for (e, n, sharded, rate), m in results.items() if n == max(counts) and sharded
                 and rate == label and (e, 1, False, label) in results]
        if gains:
            print("links %s: %d ps in slices against 1 ps: median %.2f times" % (
                label, max(counts), statistics.median(gains)), file=sys.stderr)
    print("wrote ps_sweep.md and ps_sweep.png to %s in %.0f s" % (
        args.out, time.time() - started), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
