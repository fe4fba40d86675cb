"""The decision table: how long each scheme takes to reach a good-enough model on a cluster.

    sudo python benchmarks/decision_table.py --tune       # 1. each row's learning rate
    sudo python benchmarks/decision_table.py              # 2. the table, at the tuned rates
    sudo python benchmarks/decision_table.py --quick      # 2 examples, 1 rate, 1 repeat: smoke
    python benchmarks/decision_table.py --from_logs       # redraw from the last run's logs
    python benchmarks/decision_table.py --tune --from_logs   # redraw the tuning table
    python benchmarks/step_time_model.py                  # 3. the model that predicts the cells

The question a user choosing a scheme asks is the one MLPerf measures: seconds until the test
accuracy reaches a target, on my cluster. Every distributed example (scaling.py's selection;
--examples names others) runs with --workers workers (3) and 1 ps through benchmarks/cluster.py,
every task a host of its own: a network namespace behind links of each rate in --bandwidth
(unlimited and 100 Mbit/s) and a cgroup CPU quota of --cpus cores (0.4). The problem is MNIST-1D
(--problem) at the scaling benchmark's workload, so that a mini-batch costs more to compute
than to send at the unlimited rate: --hidden 4096, --batch_size 512, --steps mini-batches in all.

The rows
    one process, SGD      Non-Distributed-Setup on one such host: the baseline of every scheme
                          whose workers step with plain SGD
    one process, AdamW    the same with --optimizer adamw: the baseline of DiLoCo, whose
                          workers step with AdamW, so that its speed-up is not the optimizer's
    every scheme          at its tuned learning rate
    Local SGD             DiLoCo's rounds with SGD inside and an outer step of rate 1 without
                          momentum (the workers' models averaged): what AdamW buys DiLoCo

Tuning (--tune), published in decision_table_tuning.md: every row runs once at each rate of a
grid of three, its example's default learning rate times 1/3, 1 and 3, on unlimited links, on a
validation split carved from the training set (its last 400 signals, the test set never seen);
where the best is the largest or the smallest rate tried, once more at 3 times beyond it (twice
at most). The rate with the highest mean validation accuracy over the run's evaluations wins:
it rewards learning fast and learning well at once, and needs no target. The other knobs
(windows, alpha, the compression ratio) keep their defaults: the CPU budget of 2 cores buys
one grid.

The table (after --tune, which it reads): each row at its tuned rate, --repeats runs (3) at
every rate, seeds SEED, SEED + 1, ...; the one-process rows once per repeat, for every column.
Two targets, set after the runs from their own results: 97% of the median final test accuracy
of the tuned one-process SGD runs (what one process reaches with margin), and 80% of it (what
every scheme reaches with margin, where they part ways in speed); both read from the same runs'
histories. Each cell is the median (and range) of the seconds to the target; "k of 3: S" when
only k runs reached it (S their median), "not reached" when none did in its --steps. The clock of every run starts when its first update has returned (set-up, the
session's first run and TensorFlow 2's tracing are not timed). A run that overruns --timeout
counts as not reached.

How long: tuning 16 rows x 3 rates = 48 runs on unlimited links and the rates beyond an edge
(29 more here: 47 minutes in all); the table 16 rows x 3 runs on unlimited links and 14 x 3 at
100 Mbit/s (90 runs). Run one rate or part at a time (--bandwidth,
--examples, --repeat_from), then draw the whole table from every run's log with --from_logs.

Writes into --out (benchmarks/results/mnist1d with --problem mnist1d):
  decision_table_tuning.md / .json   the grid, each run's score, the rate chosen, the budget
  decision_table.md                  the table, one row per example, a column per rate
  decision_table_runs.json           every run's record: its history, bytes and rates (what
                                     step_time_model.py and the tests read)
  decision_table.png                 seconds to the target against the rate
  logs/decision-*                    every run's output and metrics
Needs what cluster.py --cpus needs: Linux, root, iproute2's ip and tc, a cgroup cpu controller.
"""
import collections
import json
import math
import os
import statistics
import sys
import time

import cluster  # benchmarks/cluster.py: the hosts, their CPU quotas and their links
import published_tables  # the figures reach the READMEs only through here
import example_runs  # how every benchmark runs an example and reads its metrics
import problems  # the validation split
import scaling  # benchmarks/scaling.py: the workload, the selection, one process on one host
import command_line  # link rates and the one-line error
from example_runs import BASELINE

ONE_SGD, ONE_ADAMW, LOCAL_SGD = "one process, SGD", "one process, AdamW", "Local SGD"
GRID = (1 / 3.0, 1.0, 3.0)  # times the example's default learning rate
# the targets, shares of the tuned one-process SGD runs' median final test accuracy: 97% (with
# margin under one process's plateau), and 80% (under every scheme's plateau, with margin)
TARGET_SHARES = (0.97, 0.80)
TUNING, RUNS = "decision_table_tuning.json", "decision_table_runs.json"

# label, example, its flags, the one-process row its speed-up is against (None: it is one)
Row = collections.namedtuple("Row", "label example flags baseline")


def table_rows(names):
    """The table's rows for the distributed examples names, the one-process rows first."""
    rows = [Row(ONE_SGD, BASELINE, (), None),
            Row(ONE_ADAMW, BASELINE, ("--optimizer", "adamw", "--learning_rate", "0.001"), None)]
    for name in names:
        rows.append(Row(name, name, (), ONE_ADAMW if name == "DiLoCo" else ONE_SGD))
        if name == "DiLoCo":
            rows.append(Row(LOCAL_SGD, name, ("--inner_optimizer", "sgd", "--learning_rate", "0.1",
                                              "--outer_learning_rate", "1",
                                              "--outer_momentum", "0"), ONE_SGD))
    return rows


def default_learning_rate(row):
    """The learning rate the row runs at untuned: its example's default, or its own flag's."""
    flags = list(row.flags)
    if "--learning_rate" in flags:
        return float(flags[flags.index("--learning_rate") + 1])
    name = "decision_table_" + row.example.replace("-", "_")
    module = example_runs.load_example(row.example, name)
    return module.parse_flags([], module.example_flags).learning_rate


def parser(prog):
    p = example_runs.argparse_for(prog, __doc__)
    example_runs.add_run_flags(p, steps=900, eval_every=10, problem=True)
    p.set_defaults(batch_size=512, problem="mnist1d", timeout=900)
    p.add_argument("--cpus", type=cluster.positive_cores, default=0.4, metavar="C",
                   help="cores of every host, a cgroup CPU quota each (default: 0.4)")
    p.add_argument("--workers", type=int, default=3, help="workers per run (default: 3)")
    p.add_argument("--bandwidth", default="unlimited,100mbit", metavar="RATES",
                   help="comma-separated link rates (default: unlimited,100mbit)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per row and rate, run r with --seed SEED + r (default: 3)")
    p.add_argument("--repeat_from", type=int, default=0, metavar="R",
                   help="run only runs R to --repeats - 1 (a table measured in parts: the "
                        "runs before R are left as they are, for --from_logs; default: 0)")
    p.add_argument("--examples", default="",
                   help="comma-separated distributed examples (default: scaling.py's)")
    p.add_argument("--tune", action="store_true",
                   help="choose every row's learning rate on the validation split, at unlimited "
                        "links (run it first: the table reads its choice)")
    p.add_argument("--resume", action="store_true",
                   help="read back the runs whose metrics are already in --out/logs instead of "
                        "running them again (a campaign cut short goes on)")
    p.add_argument("--tuning", default=None, metavar="JSON",
                   help="the tuned learning rates to run at (default: --tune's file in --out)")
    p.add_argument("--quick", action="store_true",
                   help="DOWNPOUR and Sync-SGD, unlimited links, 1 repeat, 60 steps, untuned: a "
                        "smoke run that publishes nothing")
    return p


# --- what a run left: its record ------------------------------------------------------------------
def record(row, rate_label, bits, repeat, seed, learning_rate, metrics, wall_seconds=None):
    """What the table, the reading and the step-time model need of one run (metrics None: it
    overran its timeout)."""
    run = dict(row=row.label, example=row.example, rate=rate_label, bits=bits, repeat=repeat,
               seed=seed, learning_rate=learning_rate, overran=metrics is None)
    if metrics is None:
        return run
    report = metrics.get("cluster", {})
    run.update(history=[[round(s, 3), step, round(accuracy, 4)]
                        for s, step, accuracy in (h[:3] for h in metrics["history"])],
               test_accuracy=metrics["test_accuracy"],
               mini_batches_per_sec=metrics["steps_per_sec"],
               timed_seconds=example_runs.timed_seconds(metrics),
               mini_batches=report.get("mini_batches", metrics.get("global_step")),
               busiest_bytes=report.get("busiest_link", {}).get("bytes"),
               busiest_both=max((h["sent_bytes"] + h["received_bytes"]
                                 for h in report.get("hosts", {}).values()), default=None),
               wall_seconds=wall_seconds,
               cpu_seconds=sum(v for k, v in report.items() if k.startswith("cpu_seconds_"))
               or None)
    return run


def seconds_to(run, target):
    """Seconds from the run's first update until its test accuracy first reached target (None:
    never, or it overran)."""
    for seconds, _, accuracy in run.get("history", []):
        if accuracy >= target:
            return seconds
    return None


def target_of(runs, share):
    """share of the median final test accuracy of the one-process SGD runs, rounded down to a
    thousandth (MNIST-1D's test set has 1000 signals)."""
    finals = [r["test_accuracy"] for r in runs if r["row"] == ONE_SGD and not r["overran"]]
    if not finals:
        raise ValueError("no run of %r: the target is set from it" % ONE_SGD)
    # the accuracies are float32 (0.69 is 0.68999...): to the thousandth first, then down
    return math.floor(round(share * round(statistics.median(finals), 4) * 1000, 6)) / 1000


def cell_runs(runs, label, rate):
    """The runs of row label at rate (the one-process rows: at every rate)."""
    return [r for r in runs if r["row"] == label and (r["rate"] == rate or r["rate"] is None)]


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


def median_seconds(runs, label, rate, target):
    """(median seconds of the runs that reached target, how many did, how many ran)."""
    seconds = [seconds_to(r, target) for r in cell_runs(runs, label, rate)]
    reached = [s for s in seconds if s is not None]
    return (statistics.median(reached) if reached else None), len(reached), len(seconds)


# --- the table, its reading and its plot ----------------------------------------------------------
def labels_of(runs):
    return list(dict.fromkeys(r["row"] for r in runs))


def rates_of(runs):
    """[(label, bits)] of the distributed runs, fastest first."""
    rates = {r["rate"]: r["bits"] for r in runs if r["rate"] is not None}
    return sorted(rates.items(), key=lambda kv: float("-inf") if kv[1] is None else -kv[1])


def targets(settings):
    """[(share of the one-process SGD accuracy or None, target accuracy)], strictest first."""
    return [tuple(t) for t in settings["targets"]]


def target_name(share, target):
    return "%.3f" % target + (" (%d%%)" % round(100 * share) if share else "")


def write_table(path, runs, settings):
    rates = rates_of(runs)
    tuned = {r["row"]: r["learning_rate"] for r in runs}
    columns = [(share, target, rate, bits) for share, target in targets(settings)
               for rate, bits in rates]
    lines = ["| row | learning rate | " + " | ".join(
        "s to %.3f, %s" % (target, command_line.format_rate(bits))
        for _, target, _, bits in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for label in labels_of(runs):
        lines.append("| %s | %g | %s |" % (label, tuned[label], " | ".join(
            cell([seconds_to(r, target) for r in cell_runs(runs, label, rate)])
            for _, target, rate, _ in columns)))
    shares = [(share, target) for share, target in targets(settings) if share]
    lines += ["", "%sEach cell: the median (and range) over %d run(s) of the seconds from the "
              "run's first update to the target; \"k of n\" where only k runs reached it. %d "
              "workers and 1 ps, every host %g core(s) (a cgroup CPU quota of its own); the "
              "one-process rows on one such host, the same runs in every column; --hidden 4096, "
              "--batch_size %d, %d mini-batches a run; every learning rate tuned on a "
              "validation split (decision_table_tuning.md); %d CPU core(s) in all. Measured "
              "with `%s`."
              % ("Targets: %s of the median final test accuracy of the one-process SGD runs, "
                 "on %s. " % (" and ".join("%.3f, %d%%" % (t, round(100 * sh))
                                           for sh, t in shares), settings["problem"])
                 if shares else "",
                 settings["repeats"], settings["workers"], settings["cpus"],
                 settings["batch_size"], settings["steps"], settings["cores"],
                 settings["command"])]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def speed_up(runs, row, rate, target):
    """The row's median seconds at rate, how many of its runs reached the target, of how many,
    and its speed-up against its one-process baseline (None where either did not reach the
    target in every run)."""
    seconds, k, n = median_seconds(runs, row.label, rate, target)
    base, bk, bn = median_seconds(runs, row.baseline, None, target)
    every = seconds and base and k == n and bk == bn  # a median of some runs is no speed-up
    return seconds, k, n, (base / seconds if every else None)


def which_scheme(runs, rows, settings):
    """The table read for a user choosing a scheme (the root README's "Which scheme when"): per
    target and rate, the three rows first to the target (those that reached it in every run
    first), each with its speed-up against the one-process baseline it names; those slower
    than their baseline; those that did not reach it in every run. Then the sentences that the
    cells support, each built from them."""
    rates = rates_of(runs)
    distributed = [row for row in rows if row.baseline and row.label in labels_of(runs)]
    lines = ["| target | links | first to the target (median s; speed-up against its "
             "one-process baseline) | slower than its baseline | not in every run |",
             "|---|---|---|---|---|"]
    for share, target in targets(settings):
        for rate, bits in rates:
            timed, slower, missed = [], [], []
            for row in distributed:
                seconds, k, n, gain = speed_up(runs, row, rate, target)
                if k < n:
                    missed.append("%s (%d of %d)" % (row.label, k, n))
                if seconds is not None:
                    timed.append((k < n, seconds, row, k, n, gain))
                if gain is not None and gain < 1:
                    slower.append(row.label)
            timed.sort(key=lambda t: (t[0], t[1]))
            first = []
            for _, seconds, row, k, n, gain in timed[:3]:
                text = "%s %.1f s" % (row.label, seconds)
                if gain is not None:
                    text += " (%.1fx against %s)" % (gain, row.baseline)
                if k < n:
                    text += ", %d of %d runs" % (k, n)
                first.append(text)
            lines.append("| %s | %s | %s | %s | %s |" % (
                target_name(share, target), command_line.format_rate(bits),
                "; ".join(first) or "none", ", ".join(slower) or "none",
                ", ".join(missed) or "none"))
    lines += [""] + ["- " + s for s in sentences(runs, rows, settings)]
    lines += ["", "Read from the decision table (%d workers and 1 ps on hosts of %g core(s), %s, "
              "%d run(s) a cell, every learning rate tuned), written by `%s`."
              % (settings["workers"], settings["cpus"], settings["problem"], settings["repeats"],
                 settings["command"])]
    return "\n".join(lines)


def sentences(runs, rows, settings):
    """What the cells say, in words: the baselines, DiLoCo against both and against Local SGD,
    and, per target and rate, which rows beat their baseline. Each figure comes from a cell."""
    rates, labels = rates_of(runs), labels_of(runs)
    by_label = {row.label: row for row in rows}
    said = []
    for share, target in targets(settings):
        name = target_name(share, target)
        sgd, _, _ = median_seconds(runs, ONE_SGD, None, target)
        adamw, _, _ = median_seconds(runs, ONE_ADAMW, None, target)
        said.append("**To %s, one process** takes %s with SGD and %s with AdamW." % (
            name, "%.1f s" % sgd if sgd else "longer than its run (not reached)",
            "%.1f s" % adamw if adamw else "longer than its run (not reached)"))
        if "DiLoCo" in labels and LOCAL_SGD in labels:
            d, _, _, gain = speed_up(runs, by_label["DiLoCo"], rates[0][0], target)
            local, _, _, local_gain = speed_up(runs, by_label[LOCAL_SGD], rates[0][0], target)
            if d is not None and local is not None:
                said.append("**What AdamW buys DiLoCo, to %s:** on unlimited links DiLoCo takes "
                            "%.1f s%s, Local SGD (the same rounds with SGD inside) %.1f s%s." % (
                                name, d, " (%.1fx against one process with AdamW)" % gain
                                if gain else "", local, " (%.1fx against one process with SGD)"
                                % local_gain if local_gain else ""))
        for rate, bits in rates:
            ups = [(row.label, speed_up(runs, row, rate, target)) for row in rows
                   if row.baseline and row.label in labels]
            ahead = [label for label, up in ups if (up[3] or 0) > 1]
            reached = [label for label, up in ups if up[1] > 0]
            said.append("**To %s, %s links:** %s." % (
                name, command_line.format_rate(bits),
                "%s beat%s its one-process baseline" % (", ".join(ahead), "" if len(ahead) > 1
                                                        else "s")
                if ahead else "no scheme beats its one-process baseline" + (
                    "" if reached else "; none reaches the target in its mini-batches")))
    return said


def plot(path, runs, settings):
    """Seconds to each target against the link rate, a panel per target, a line per row."""
    plt = example_runs.pyplot()
    rates, panels = rates_of(runs), targets(settings)
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels) + 3, 5), squeeze=False)
    positions = list(range(len(rates)))
    for ax, (share, target) in zip(axes[0], panels):
        for i, label in enumerate(labels_of(runs)):
            xs, medians, below, above = [], [], [], []
            for x, (rate, _) in zip(positions, rates):
                reached = sorted(s for s in (seconds_to(r, target)
                                             for r in cell_runs(runs, label, rate))
                                 if s is not None)
                if reached:
                    median = statistics.median(reached)
                    xs.append(x)
                    medians.append(median)
                    below.append(median - reached[0])
                    above.append(reached[-1] - median)
            if xs:
                style = example_runs.line_style(i)
                if label in (ONE_SGD, ONE_ADAMW):
                    style.update(color="gray", linestyle=":" if label == ONE_SGD else "--")
                ax.errorbar(xs, medians, yerr=[below, above], label=label, capsize=3, **style)
        ax.set_xticks(positions)
        ax.set_xticklabels([command_line.format_rate(bits) for _, bits in rates])
        ax.set_xlabel("link rate")
        ax.set_yscale("log")
        ax.set_title("to %s test accuracy" % target_name(share, target))
        ax.set_ylabel("seconds (median, range; log scale)")
    if axes[0][-1].get_legend_handles_labels()[0]:  # the last (loosest) target: every row
        axes[0][-1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- running -------------------------------------------------------------------------------------
def run_row(args, row, who, tag, learning_rate, seed, rate_label=None):
    """One run of row at learning_rate: one process on one host, or the example's cluster at
    rate_label. Returns (metrics or None, wall seconds). With --resume, a run whose metrics are
    already in --out/logs is read back instead (its wall time from its .wall file beside)."""
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    metrics_path, wall_path = (os.path.join(logs, tag + ext) for ext in (".json", ".wall"))
    if args.resume and not args.from_logs and os.path.exists(metrics_path):
        metrics, wall = example_runs.read_metrics(metrics_path), None
    else:  # with --from_logs, run_example and run_baseline read the logs back
        started = time.time()
        metrics = run_fresh(args, row, who, tag, learning_rate, seed, rate_label)
        wall = None if args.from_logs else time.time() - started
        if wall is not None:
            with open(wall_path, "w") as f:
                f.write("%.1f\n" % wall)
    if wall is None:
        wall = float(open(wall_path).read()) if os.path.exists(wall_path) else 0.0
    return metrics, wall


def run_fresh(args, row, who, tag, learning_rate, seed, rate_label):
    flags = list(scaling.WORKLOAD) + list(row.flags) + ["--learning_rate", "%g" % learning_rate]
    if row.baseline is None:
        return scaling.run_baseline(args, who, tag=tag, seed=seed, workload=flags)
    return example_runs.run_example(
        row.example, args.workers, args, tag, train_args=flags, bandwidth=rate_label,
        cpus=args.cpus, who=who, seed=seed, timeout_is_a_result=True)


def score(metrics):
    """A tuning run's score: its mean validation accuracy over its evaluations (0: overran)."""
    if metrics is None or not metrics["history"]:
        return 0.0
    return statistics.mean(h[2] for h in metrics["history"])


def tune(args, rows, who, progress):
    """Every row once at each rate of GRID times its default learning rate, on the validation
    split at unlimited links; where the best is the grid's largest or smallest rate, one more
    rate 3 times beyond it, twice at most (a best at the edge of the rates tried is no optimum).
    Returns the tuning table; writes it and its JSON ({label: chosen rate, scores}, budget)."""
    test_data, args.data_path = args.data_path, problems.validation_path(args.problem)
    scores, budget = {row.label: {} for row in rows}, dict(runs=0, wall_seconds=0.0,
                                                          cpu_seconds=0.0)

    def measure(row, lr, i, n):
        progress(i, n, "tuning %s at learning rate %g" % (row.label, lr))
        tag = "decision-tune-%s-lr%g" % (row.label.replace(" ", "-").replace(",", ""), lr)
        metrics, wall = run_row(args, row, who, tag, lr, args.seed,
                                None if row.baseline is None else "unlimited")
        hosts = 1 if row.baseline is None else args.workers + 2
        budget["runs"] += 1
        budget["wall_seconds"] += wall
        used = sum(v for k, v in ((metrics or {}).get("cluster") or {}).items()
                   if k.startswith("cpu_seconds_"))
        budget["cpu_seconds"] += used or wall * args.cpus * hosts
        scores[row.label][lr] = round(score(metrics), 4)

    plan = [(row, float("%.3g" % (default_learning_rate(row) * f))) for row in rows for f in GRID]
    for i, (row, lr) in enumerate(plan, 1):
        measure(row, lr, i, len(plan))
    for extension in range(2):  # a best at an edge: one more rate beyond it
        beyond = []
        for row in rows:
            tried = sorted(scores[row.label])
            best = max(tried, key=lambda lr: scores[row.label][lr])
            if best in (tried[0], tried[-1]):
                beyond.append((row, float("%.3g" % (best * (3 if best == tried[-1] else 1 / 3.0)))))
        for i, (row, lr) in enumerate(beyond, 1):
            measure(row, lr, i, len(beyond))
    args.data_path = test_data
    chosen, lines = {}, []
    for row in rows:
        tried = scores[row.label]
        best = max(sorted(tried), key=lambda lr: tried[lr])
        chosen[row.label] = dict(learning_rate=best, scores={"%g" % lr: tried[lr]
                                                             for lr in sorted(tried)})
        edge = {max(tried): ", the largest tried", min(tried): ", the smallest tried"}
        lines.append("| %s | %s | %g%s |" % (row.label, " / ".join(
            ("**%g: %.3f**" if lr == best else "%g: %.3f") % (lr, tried[lr])
            for lr in sorted(tried)), best, edge.get(best, "")))
    path = os.path.join(args.out, TUNING)
    text = "\n".join(
        ["| row | learning rate: mean validation accuracy | chosen |", "|---|---|---|"] + lines
        + ["", "Each row once at 1/3, 1 and 3 times its example's default learning rate, and "
           "where the best was the largest or the smallest rate tried, at one more rate 3 times "
           "beyond it (twice at most); on unlimited links, %d workers and 1 ps on hosts of %g "
           "core(s) (one process on one host for the one-process rows), %d mini-batches, on "
           "the validation split (the last %d training signals of %s; the test set never "
           "seen); the score: the mean validation accuracy over the run's evaluations. Budget: "
           "%d runs, %.0f minutes of wall time, %.0f CPU-minutes (the hosts' own CPU time; "
           "the quota's for one process). Measured with `%s`."
           % (args.workers, args.cpus, args.steps, problems.VALIDATION, args.problem,
              budget["runs"], budget["wall_seconds"] / 60, budget["cpu_seconds"] / 60,
              example_runs.rerun_command("decision_table.py", ["--tune"], sudo=True))])
    with open(path, "w") as f:
        json.dump(dict(rows=chosen, budget=budget), f, indent=1)
    with open(os.path.join(args.out, "decision_table_tuning.md"), "w") as f:
        f.write(text + "\n")
    if example_runs.publishing(args, args.quick, published=("mnist1d",)):
        published_tables.publish(example_runs.section("decision_table.py", args) + "-tuning",
                                 text, [published_tables.BENCHMARKS_README])
    return text


def tuned_rates(args, rows):
    """{label: learning rate} from --tune's file; a row it has not tuned fails in one line."""
    path = args.tuning or os.path.join(args.out, TUNING)
    if args.quick:
        return {row.label: default_learning_rate(row) for row in rows}
    try:
        with open(path) as f:
            tuned = json.load(f)["rows"]
        return {row.label: tuned[row.label]["learning_rate"] for row in rows}
    except (OSError, ValueError, KeyError) as e:
        raise ValueError("no tuned learning rate for every row in %s (%s): run it with --tune "
                         "first" % (os.path.relpath(path), e))


def main(argv=None, prog="decision_table.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = example_runs.parse_run_flags(parser(prog), argv)
    if args.quick:
        args.examples, args.bandwidth, args.repeats, args.steps = "DOWNPOUR,Sync-SGD", \
            "unlimited", 1, 60
    try:
        rates = command_line.parse_rates("unlimited" if args.tune else args.bandwidth)
        names = [e for e in example_runs.select_examples(args.examples) if e != BASELINE
                 and (e not in scaling.LEFT_OUT or args.examples)]
        if not names:
            raise ValueError("--examples: name at least one distributed example")
        if args.workers < 1 or args.repeats < 1:
            raise ValueError("--workers and --repeats must be at least 1")
        if not 0 <= args.repeat_from < args.repeats:
            raise ValueError("--repeat_from %d: give a run from 0 to --repeats - 1 (%d)"
                             % (args.repeat_from, args.repeats - 1))
        rows = table_rows(names)
        learning_rates = None if args.tune else tuned_rates(args, rows)
        if not args.from_logs:  # before any run: a machine that cannot fails in one line
            cluster.check_machine(needs_tc=any(bits is not None for _, bits in rates))
            cluster.check_cpus(args.workers + 2, args.cpus)  # the workers, a ps, a coordinator
        example_runs.make_data(args)  # after every flag check: a wrong flag makes nothing
    except (ValueError, RuntimeError, cluster.SetupError) as e:
        return command_line.error(str(e))
    who = os.path.splitext(prog)[0]
    os.makedirs(args.out, exist_ok=True)
    started = time.time()

    def progress(i, n, what):
        print("[%d/%d] %s (%.0f s so far)" % (i, n, what, time.time() - started),
              file=sys.stderr, flush=True)

    if args.tune:
        print(tune(args, rows, who, progress))
        return 0
    first = 0 if args.from_logs else args.repeat_from  # a redraw reads every run's log
    plan = [(row, None, None, r) for r in range(first, args.repeats) for row in rows
            if row.baseline is None]
    plan += [(row, label, bits, r) for label, bits in rates for row in rows if row.baseline
             for r in range(first, args.repeats)]
    runs = []
    for i, (row, label, bits, r) in enumerate(plan, 1):
        lr = learning_rates[row.label]
        progress(i, len(plan), "%s at learning rate %g, %s, run %d" % (
            row.label, lr, "one host" if label is None else "links " + label, r + 1))
        tag = "decision-%s-%s-r%d" % (row.label.replace(" ", "-").replace(",", ""),
                                       label or "one-host", r)
        metrics, wall = run_row(args, row, who, tag, lr, args.seed + r, label)
        runs.append(record(row, label, bits, r, args.seed + r, lr, metrics, wall))
    settings = dict(command=example_runs.rerun_command(prog, argv, sudo=True),
                    repeats=args.repeats - first, problem=args.problem, workers=args.workers,
                    cpus=args.cpus, batch_size=args.batch_size, steps=args.steps,
                    cores=os.cpu_count())
    try:
        settings["targets"] = [(None, args.target)] if args.quick else [
            (share, target_of(runs, share)) for share in TARGET_SHARES]
    except ValueError as e:
        return command_line.error(str(e))
    with open(os.path.join(args.out, RUNS), "w") as f:
        json.dump(dict(settings=settings, rows=[row._asdict() for row in rows], runs=runs), f)
    table = write_table(os.path.join(args.out, "decision_table.md"), runs, settings)
    print(table)
    reading = which_scheme(runs, rows, settings)
    print("\n" + reading)
    if example_runs.publishing(args, args.quick, published=("mnist1d",)):
        published_tables.publish(example_runs.section("decision_table.py", args), table,
                                 [published_tables.BENCHMARKS_README])
        published_tables.publish(example_runs.section("decision_table.py", args) + "-reading",
                                 reading, [published_tables.ROOT_README])
    plot(os.path.join(args.out, "decision_table.png"), runs, settings)
    print("\nwrote decision_table.md, %s and decision_table.png to %s in %.0f s"
          % (RUNS, args.out, time.time() - started), file=sys.stderr)
    return 0


def load_runs(path):
    """The runs file a table was drawn from: (settings, [Row], [run records])."""
    with open(path) as f:
        saved = json.load(f)
    return saved["settings"], [Row(**row) for row in saved["rows"]], saved["runs"]


if __name__ == "__main__":
    sys.exit(main())
