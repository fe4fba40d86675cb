"""When distribution pays: every distributed example with 1, 2 and 3 workers on hosts that each
have CPU of their own, against one process on one such host.

    sudo python benchmarks/scaling.py                                  # the published run
    sudo python benchmarks/scaling.py --examples DOWNPOUR,Sync-SGD --workers 1,3
    sudo python benchmarks/scaling.py --bandwidth unlimited --quick    # a smoke run
    python benchmarks/scaling.py --from_logs                           # redraw, no training

On this machine every process shares the same two cores, so a second worker adds messages and
no computing power, and one process is always the fastest. A cluster adds a machine's cores with
every worker. Here every task runs through benchmarks/cluster.py on a host of its own: a network
namespace, and a cgroup CPU quota of --cpus cores (0.4 by default, so that 3 workers, a ps and
a coordinator fit in 2 cores). The baseline, Non-Distributed-Setup, runs in one process capped
the same way. Every example gets the same workload, chosen so that computing a mini-batch costs
more than sending it: --hidden 4096 and --batch_size 512 (1.2 MB of parameters; one process at
0.4 core trains 28 mini-batches a second in the published run, while the 2.4 MB that
Distributed-Setup pulls and pushes a mini-batch take 19 ms at 1 Gbit/s), --steps 900
mini-batches in all. Links are unlimited and
1 Gbit/s by default (--bandwidth).

The clock times training alone, the same way for every scheme: by default (--eval_every 0) no
task evaluates until the training has ended, and every summary's steps_per_sec stops before its
chief's (or coordinator's) last evaluation. Evaluating inside a timed run costs the schemes
differently (the ParameterServerStrategy coordinator schedules no step while it evaluates; in the
tf.compat.v1 examples only the chief pauses), so a table timed that way reads an evaluation
policy as a scheme's pace. With --eval_every N the chief evaluates every N of its steps, and the
table adds the seconds to the target accuracy (benchmarks/compare.py measures those on one
machine, evaluating as it goes).

Every cell at unlimited links, the baseline included, runs --repeats times (3 by default), the
rounds one after the other so that a slow spell of the machine falls on every cell alike: one run
a cell cannot tell a scheme's cost from the machine's noise (one host's own rate varies by some
10% between runs). At a limited rate only the most workers run (--limited_workers), and
--limited_repeats times (1 by default, in the first round): those cells show how much of the
link a step uses, and all worker counts three times over would add some 2 hours. The tables
give each figure's median over the runs and, after it, their range; a speed-up is each run's
rate over the median of one host's.

Writes into --out:
  scaling.md    one row per example, workers and link rate: mini-batches/s (all workers),
                speed-up over one host, parallel efficiency (speed-up / workers) (with
                --eval_every, seconds to 0.95 test accuracy and its speed-up): medians, with
                their ranges;
  speed_up.png   speed-up against workers, one line per example (the median, a bar over the
                range), the ideal line, one panel per link rate;
  logs/scaling-*  every run's output and metrics (cluster.py's report, with each host's CPU
                seconds, included); a repeat's tag ends in -r2, -r3, ...

Evolution-Strategies is left out unless --examples names it: its work is --population forward
passes per mini-batch, so at this workload a generation takes seconds and its speed-up measures
something else. So are In-Graph-Replication, whose towers split one mini-batch (512 examples
do not split over 3), and Model-Parallel-Pipeline, whose workers are stages of one model, not
more data per second (benchmarks/pipeline.py measures it). Needs what cluster.py --cpus needs:
Linux, root, iproute2's ip (tc for a limited rate) and a cgroup cpu controller.
"""
import os
import shlex
import statistics
import subprocess
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, their CPU quotas and their links
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how this benchmark runs an example and reads its metrics
import command_line  # link rates and the one-line error
from example_runs import BASELINE, mini_batches_per_sec, time_to_target

WORKLOAD = ["--hidden", "4096"]  # with --batch_size 512: computation outweighs the messages
# Evolution-Strategies spends its CPU on --population forward passes per mini-batch, not on one
# gradient: at this workload a generation takes seconds, and its speed-up is not the same measure
# In-Graph-Replication splits one mini-batch over the workers' towers (512 does not split over 3),
# and Model-Parallel-Pipeline's workers are stages of one model (benchmarks/pipeline.py)
LEFT_OUT = {"Evolution-Strategies", "In-Graph-Replication", "Model-Parallel-Pipeline"}


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__)
    example_runs.add_run_flags(p, steps=900, eval_every=0, problem=True)
    p.set_defaults(batch_size=512)  # --eval_every 0: at the end only, after the timed training
    p.add_argument("--cpus", type=cluster.positive_cores, default=0.4, metavar="C",
                   help="cores of every host, a cgroup CPU quota each (default: 0.4)")
    p.add_argument("--workers", default="1,2,3", metavar="COUNTS",
                   help="comma-separated worker counts (default: 1,2,3)")
    p.add_argument("--bandwidth", default="unlimited,1gbit", metavar="RATES",
                   help="comma-separated link rates in tc's units, or unlimited "
                        "(default: unlimited,1gbit)")
    p.add_argument("--examples", default="",
                   help="comma-separated distributed examples (default: all)")
    p.add_argument("--repeats", type=int, default=3, metavar="R",
                   help="runs of every cell at unlimited links, the baseline's included: the "
                        "tables give the median and the range (default: 3)")
    p.add_argument("--limited_repeats", type=int, default=1, metavar="R",
                   help="runs of every cell at a limited link rate, at most --repeats "
                        "(default: 1)")
    p.add_argument("--limited_workers", default="", metavar="COUNTS",
                   help="the worker counts run at a limited link rate, among --workers "
                        "(default: the most)")
    p.add_argument("--resume", action="store_true",
                   help="read back the runs whose metrics are already in --out/logs instead of "
                        "running them again (a run cut short goes on)")
    p.add_argument("--quick", action="store_true",
                   help="100 steps, 2 workers at most, one run a cell: a smoke run that "
                        "publishes nothing")
    return p


def runs_of(metrics):
    """A cell's runs: a list of metrics, or one run's metrics alone."""
    return metrics if isinstance(metrics, list) else [metrics]


def spread(values, form="%.2f"):
    """The median of values, and their range after it where there are several."""
    middle = form % statistics.median(values)
    if len(values) == 1:
        return middle
    return "%s (%s-%s)" % (middle, form % min(values), form % max(values))


def one_host_rate(baseline):
    """One host's mini-batches/s: the median of the baseline's runs."""
    return statistics.median(mini_batches_per_sec(m) for m in runs_of(baseline))


def speed_ups(metrics, one_host):
    """Each run's rate over one host's."""
    return [mini_batches_per_sec(m) / one_host for m in runs_of(metrics)]


def median_time_to_target(metrics, goal):
    """The median seconds to goal over the runs that reached it; None where none did."""
    times = [s for s in (time_to_target(m, goal) for m in runs_of(metrics)) if s is not None]
    return statistics.median(times) if times else None


def worker_counts(text):
    counts = sorted({int(t) for t in text.split(",") if t.strip()})
    if not counts or counts[0] < 1:
        raise ValueError("--workers: give counts of 1 or more, such as 1,2,3")
    return counts


def rounds(cells, repeats, limited_repeats):
    """The cells of every round, in order: a cell (example, workers, link rate) at unlimited
    links is in all repeats rounds, one at a limited rate in the first limited_repeats."""
    return [[cell for cell in cells if cell[2] == "unlimited" or run <= limited_repeats]
            for run in range(1, repeats + 1)]


def runs_said(results, baseline):
    """How many runs each figure is the median of, for the table's last line."""
    counts = {}
    for (_, _, label), metrics in results.items():
        counts[label] = max(counts.get(label, 1), len(runs_of(metrics)))
    most = max([len(runs_of(baseline))] + list(counts.values()))
    if most == 1:
        return "one run a cell"
    fewer = ["%d at %s" % (n, label) for label, n in counts.items() if n < most]
    return "medians of %d runs a cell%s, the range in brackets" % (
        most, " (%s)" % ", ".join(fewer) if fewer else "")


def repeat_tag(tag, run):
    """The tag of a cell's run-th run: the first keeps the cell's own, so that earlier logs
    still redraw."""
    return tag if run == 1 else "%s-r%d" % (tag, run)


def run_baseline(args, who, tag="scaling-%s" % BASELINE, seed=None, workload=WORKLOAD):
    """Non-Distributed-Setup in one process, in a cgroup of --cpus cores: one host's speed
    (with --seed, or seed if given, and workload's flags)."""
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path, metrics_path = (os.path.join(logs, tag + ext) for ext in (".log", ".json"))
    if args.from_logs:
        return example_runs.logged_metrics(who, BASELINE, tag, log_path, metrics_path)
    tensorboard = os.path.join(logs, tag + "-tensorboard")
    example_runs.clear_earlier_run(tensorboard, metrics_path)  # or a rerun would only resume
    quotas = cluster.CpuQuotas("dtfg%d" % os.getpid(), ["local"], args.cpus)
    command = [sys.executable, os.path.join(example_runs.ROOT, BASELINE, "train.py"),
               "--steps", str(args.steps), "--batch_size", str(args.batch_size),
               "--log_every", str(args.eval_every),
               "--seed", str(args.seed if seed is None else seed),
               "--log_dir", tensorboard] + list(workload)
    if args.data_path:  # MNIST-1D, as every distributed run gets it (example_runs.run_example)
        command += ["--data_path", args.data_path]
    try:
        quotas.create()
        with open(log_path, "w") as log:
            log.write("$ %s\n" % " ".join(shlex.quote(c) for c in command))
            log.flush()
            code = subprocess.call(quotas.join_command("local") + command, stdout=log,
                                   stderr=subprocess.STDOUT, timeout=args.timeout)
    finally:
        quotas.remove()
    if code != 0:
        sys.exit("%s: the baseline failed (exit %d); see %s" % (who, code, log_path))
    metrics = example_runs.recorded_metrics(log_path, tensorboard, metrics_path)
    if metrics is None:
        sys.exit("%s: the baseline left no summary line; see %s" % (who, log_path))
    return metrics


def write_table(path, results, baseline, settings):
    """results: (example, workers, link rate) -> a cell's metrics, or a list of its runs';
    baseline: one host's, the same way. Each figure is a median, its range after it."""
    one_host = one_host_rate(baseline)
    goal = settings.get("target", example_runs.TARGET)  # the problem's (example_runs.TARGETS)
    one_host_target = median_time_to_target(baseline, goal)
    lines = ["| example | workers | links | mini-batches/s | speed-up | efficiency "
             "| s to %.2f | its speed-up |" % goal, "|---|---|---|---|---|---|---|---|",
             "| %s (one process) | 1 | none | %s | 1.00 | 1.00 | %s | 1.00 |" % (
                 BASELINE, spread([mini_batches_per_sec(m) for m in runs_of(baseline)], "%.1f"),
                 "%.1f" % one_host_target if one_host_target else "n/a")]
    timed_alone = settings.get("eval_every") == 0  # no accuracy until the end: no time to it
    for (example, workers, label), metrics in results.items():
        ups = speed_ups(metrics, one_host)
        target = median_time_to_target(metrics, goal)
        target_speed_up = (one_host_target / target) if target and one_host_target else None
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            example, workers, label,
            spread([mini_batches_per_sec(m) for m in runs_of(metrics)], "%.1f"), spread(ups),
            spread([u / workers for u in ups]), "%.1f" % target if target else "n/a",
            "%.2f" % target_speed_up if target_speed_up else "n/a"))
    if timed_alone:  # the two columns of the seconds to the target left out
        lines = ["|".join(line.split("|")[:-3]) + "|" for line in lines]
    most = max(workers for _, workers, _ in results)
    lines.append("")
    for label in dict.fromkeys(label for _, _, label in results):  # each rate, in run order
        medians = sorted(statistics.median(speed_ups(m, one_host))
                         for (_, workers, rate), m in results.items()
                         if workers == most and rate == label)
        lines.append("With %d workers, links %s: %.2f to %.2f times one host, median %.2f."
                     % (most, label, medians[0], medians[-1], statistics.median(medians)))
    lines += ["", "Every host %g core(s) (a cgroup CPU quota of its own); --hidden 4096, "
              "--batch_size %d, %d mini-batches a run; %d CPU core(s) in all; %s. Measured "
              "with `%s`." % (settings["cpus"], settings["batch_size"], settings["steps"],
                             os.cpu_count(), runs_said(results, baseline), settings["command"])]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def bounds_table(results, baseline):
    """What bounds each example with the most workers: per link rate, each worker's pace against
    one host (1.00: a worker loses nothing to distribution), the bytes a mini-batch puts on the
    wire, how much of its bandwidth the busiest link used (a limited rate only: near 1.00, the
    link is the bound), and the CPU seconds the ps used in the whole run, start-up included
    (it spends them serving the bytes and applying the updates)."""
    one_host = one_host_rate(baseline)
    most = max(workers for _, workers, _ in results)
    lines = ["| example | links | a worker's pace / one host | kB per mini-batch "
             "| busiest link's use of its bandwidth | ps CPU seconds |",
             "|---|---|---|---|---|---|"]
    for (example, workers, label), metrics in results.items():
        if workers != most:
            continue
        reports = [m.get("cluster", {}) for m in runs_of(metrics)]
        median = lambda key, scale=1.0: statistics.median(r[key] * scale for r in reports) if all(
            key in r for r in reports) else None
        kb, fraction = median("bytes_per_mini_batch", 1e-3), median("fraction_of_bound")
        ps_cpu = [sum(v for k, v in r.items() if k.startswith("cpu_seconds_ps")) for r in reports
                  if any(k.startswith("cpu_seconds_ps") for k in r)]
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            example, label, spread([u / most for u in speed_ups(metrics, one_host)]),
            "%.0f" % kb if kb is not None else "n/a",
            "%.2f" % fraction if fraction is not None else "n/a",
            "%.1f" % statistics.median(ps_cpu) if ps_cpu else "n/a"))
    return "\n".join(lines) + "\n"


def example_sections(results, baseline, settings):
    """One paragraph per example for its own README: its speed-up with the most workers, at
    each link rate, from the same run as the table."""
    one_host = one_host_rate(baseline)
    most = max(workers for _, workers, _ in results)
    sections = {}
    for example in dict.fromkeys(example for example, _, _ in results):
        measured = [(label, speed_ups(m, one_host)) for (e, workers, label), m in results.items()
                    if e == example and workers == most]
        if not measured:
            continue
        rate_name = lambda label: ("unlimited links" if label == "unlimited" else
                                   label.replace("gbit", " Gbit/s").replace("mbit", " Mbit/s"))
        figures = " and ".join("%s times %s at %s (efficiency %.2f%s)" % (
            spread(ups), "its mini-batches/s" if i == 0 else "", rate_name(label),
            statistics.median(ups) / most, "" if len(ups) == 1 else
            "; the median of %d runs, the range in brackets" % len(ups))
            for i, (label, ups) in enumerate(measured)).replace("  ", " ")
        sections[example] = (
            "Measured speed-up: %s with %d workers, each a host of %g core (a CPU quota of "
            "its own), against one such host running %s: %s. Workload "
            "`--hidden 4096 --batch_size %d`, %d mini-batches; `%s`.\n" % (
                example, most, settings["cpus"], BASELINE, figures, settings["batch_size"],
                settings["steps"], settings["command"]))
    return sections


def plot_speed_up(path, results, baseline, rates, counts):
    plt = example_runs.pyplot()
    one_host = one_host_rate(baseline)
    figure, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates) + 3, 5), sharey=True,
                                squeeze=False)
    examples = sorted({example for example, _, _ in results})
    for ax, (label, _) in zip(axes[0], rates):
        ax.plot(counts, counts, color="black", linestyle=":", label="ideal")
        for i, example in enumerate(examples):
            xs = [n for n in counts if (example, n, label) in results]
            ups = [speed_ups(results[(example, n, label)], one_host) for n in xs]
            ys = [statistics.median(u) for u in ups]
            ax.errorbar(xs, ys, yerr=[[y - min(u) for y, u in zip(ys, ups)],
                                      [max(u) - y for y, u in zip(ys, ups)]],
                        label=example, capsize=3, **example_runs.line_style(i))
        ax.set_title("links: %s" % label)
        ax.set_xlabel("workers (hosts of their own)")
        ax.set_xticks(counts)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("speed-up over one host")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None, prog="scaling.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)
    try:
        counts = worker_counts(args.workers)
        if args.repeats < 1:
            raise ValueError("--repeats: give 1 or more runs a cell")
        if not 1 <= args.limited_repeats <= args.repeats:
            raise ValueError("--limited_repeats: give 1 to --repeats (%d) runs a cell"
                             % args.repeats)
        if args.eval_every < 0:
            raise ValueError("--eval_every: give 0 (at the end only) or a number of steps")
        if args.quick:
            args.steps, counts = 100, [n for n in counts if n <= 2]
            args.repeats = args.limited_repeats = 1
        evaluating_every = args.eval_every  # 0: the runs' --log_every is --steps, past the end
        args.eval_every = args.eval_every or args.steps
        limited_counts = worker_counts(args.limited_workers) if args.limited_workers else [
            max(counts)]
        if not set(limited_counts) <= set(counts):
            raise ValueError("--limited_workers: give counts among --workers (%s)"
                             % ",".join(map(str, counts)))
        rates = command_line.parse_rates(args.bandwidth)
        names = [e for e in example_runs.select_examples(args.examples) if e != BASELINE
                 and (e not in LEFT_OUT or args.examples)]
        if not names:
            raise ValueError("--examples: name at least one distributed example")
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=any(bits is not None for _, bits in rates))
            most_hosts = max(counts) + 2  # the workers, a ps, and a coordinator
            cluster.check_cpus(most_hosts, args.cpus)
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    who = os.path.splitext(prog)[0]
    cells = [(e, n, label) for label, bits in rates for e in names for n in counts
             if bits is None or n in limited_counts]
    plan = rounds(cells, args.repeats, args.limited_repeats)
    started, done, total = time.time(), 0, sum(len(round_cells) + 1 for round_cells in plan)
    baseline, results = [], {cell: [] for cell in cells}
    for run, round_cells in enumerate(plan, 1):  # round after round: drift falls on every cell
        for cell in [None] + round_cells:
            done += 1
            print("[%d/%d] %s, run %d (%.0f s so far)" % (
                done, total, "%s, one process on one host of %g cores" % (BASELINE, args.cpus)
                if cell is None else "%s, %d worker(s), links %s" % cell, run,
                time.time() - started), file=sys.stderr, flush=True)
            tag = repeat_tag("scaling-" + (BASELINE if cell is None else "%s-%d-%s" % cell), run)
            done_before = os.path.join(args.out, "logs", tag + ".json")
            if args.resume and not args.from_logs and os.path.exists(done_before):
                metrics = example_runs.read_metrics(done_before)
            elif cell is None:
                metrics = run_baseline(args, who, tag)
            else:
                metrics = example_runs.run_example(cell[0], cell[1], args, tag, train_args=WORKLOAD,
                                                   bandwidth=cell[2], cpus=args.cpus, who=who)
            (baseline if cell is None else results[cell]).append(metrics)
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True), cpus=args.cpus,
                    steps=args.steps, batch_size=args.batch_size, target=args.target,
                    eval_every=evaluating_every)
    table = write_table(os.path.join(args.out, "scaling.md"), results, baseline, settings)
    print(table)
    bounds = bounds_table(results, baseline)
    print(bounds)
    if example_runs.publishing(args, args.quick):
        published_tables.publish("scaling.py", table, [published_tables.BENCHMARKS_README])
        published_tables.publish("scaling.py#bounds", bounds, [published_tables.BENCHMARKS_README])
        for example, text in example_sections(results, baseline, settings).items():
            published_tables.publish("scaling.py#" + example, text,
                           [os.path.join(example_runs.ROOT, example, "README.md")])
    plot_speed_up(os.path.join(args.out, "speed_up.png"), results, baseline, rates, counts)
    most = [statistics.median(speed_ups(m, one_host_rate(baseline)))
            for (_, n, _), m in results.items() if n == max(counts)]
    print("\nwrote scaling.md and speed_up.png to %s in %.0f s; median speed-up with %d workers: "
          "%.2f" % (args.out, time.time() - started, max(counts), statistics.median(most)),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
