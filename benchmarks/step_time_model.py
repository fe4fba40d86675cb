"""A step-time model that predicts the decision table's cells from a few quantities measured once.

    python benchmarks/step_time_model.py                 # from the decision table's runs file
    python benchmarks/step_time_model.py --predict 20mbit,1gbit   # and at rates not measured

Which scheme reaches the target first depends on the cluster: how fast a host computes, how fast
its links are, how many workers there are. Running every scheme on every cluster is what a
reader cannot do, so this model predicts a scheme's seconds to the target from quantities each
measured once, all of them from the runs on unlimited links (benchmarks/decision_table.py's
decision_table_runs.json) and one process on one host:

    c    one host's compute time per mini-batch: 1 / the one-process SGD run's mini-batches per
         second (the same host, the same model and batch)
    W    the workers
    p    the scheme's own work per mini-batch beyond computing it on W hosts at once (the ps's
         update, the messages at full speed, waiting): 1 / its mini-batches per second on
         unlimited links, minus c / W
    b    the scheme's bytes per mini-batch on its busiest link (cluster.py's interface counters):
         the busier direction where reads and writes overlap (the asynchronous schemes, and the
         all-reduce, which sends and receives at once), both directions where a synchronous
         round's reads and writes take turns (Sync-SGD, EASGD, DiLoCo, Local SGD,
         Gradient-Compression)
    N    the mini-batches it needs to reach the target: its seconds to the target on unlimited
         links times its mini-batches per second there (the median of its runs)

    seconds to the target at link rate R with W workers  =  N * (c / W + p + 8 b / R)

Every mini-batch's bytes cross the busiest link once, at R, and the model does not let that
overlap with computing. It is fitted on the unlimited links only, so the cells at every other
rate are predictions it was never shown; the table gives each one's error against the measured
median, and the summary the share of those cells (of those every run reached the target in)
predicted within 25%.
"""
import argparse
import os
import statistics
import sys

import command_line  # link rates and the one-line error
import decision_table  # the runs file, the rows, the target and the cells
import example_runs
import published_tables

SYNCHRONOUS_PS = {"Sync-SGD", "EASGD", "DiLoCo", decision_table.LOCAL_SGD, "Gradient-Compression"}
WITHIN = 0.25  # a prediction within 25% of the measured median counts as right
PUBLISHED = os.path.join(published_tables.RESULTS, "mnist1d", decision_table.RUNS)
OTHER_WORKERS = os.path.join(published_tables.RESULTS, "mnist1d", "workers2", decision_table.RUNS)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def both_directions(row_label):
    return row_label in SYNCHRONOUS_PS


def wire_bytes(run):
    """The run's bytes per mini-batch on its busiest link, as the model counts them."""
    if not run.get("busiest_bytes") or not run.get("mini_batches"):
        return None
    link = run["busiest_bytes"]
    if both_directions(run["row"]) and run.get("busiest_both"):
        link = run["busiest_both"]
    return link / run["mini_batches"]


def fit(runs, target, workers):
    """The quantities of the model: c, and per distributed row (p, b, N) from its unlimited
    runs; N None where no unlimited run reached the target."""
    one_host = [r for r in runs if r["row"] == decision_table.ONE_SGD and not r["overran"]]
    c = 1.0 / median(r["mini_batches_per_sec"] for r in one_host)
    fitted = {}
    for label in decision_table.labels_of(runs):
        unlimited = [r for r in runs if r["row"] == label and r["rate"] == "unlimited"
                     and not r["overran"]]
        if not unlimited:
            continue
        rate = median(r["mini_batches_per_sec"] for r in unlimited)
        seconds = [(decision_table.seconds_to(r, target), r) for r in unlimited]
        reached = [s * r["mini_batches_per_sec"] for s, r in seconds if s is not None]
        fitted[label] = dict(p=1.0 / rate - c / workers, b=median(map(wire_bytes, unlimited)),
                             N=median(reached) if len(reached) == len(unlimited) else None,
                             mini_batches_per_sec=rate)
    return c, fitted


def predict(c, quantities, workers, bits):
    """Seconds to the target at bits per second (None: unlimited) with workers workers."""
    if quantities["N"] is None or quantities["b"] is None:
        return None
    wire = 0.0 if bits is None else 8.0 * quantities["b"] / bits
    return quantities["N"] * (c / workers + quantities["p"] + wire)


def cell_text(predicted, runs, label, rate, target):
    """(the cell's text, its error or None where there is nothing to judge)."""
    seconds, k, n = decision_table.median_seconds(runs, label, rate, target)
    if predicted is None or seconds is None or k < n:
        measured = decision_table.cell([decision_table.seconds_to(r, target)
                                        for r in decision_table.cell_runs(runs, label, rate)])
        return "%s / %s" % ("%.1f" % predicted if predicted else "-", measured), None
    error = predicted / seconds - 1
    return "%.1f / %.1f (%+.0f%%)" % (predicted, seconds, 100 * error), error


def evaluate(runs, settings, extra_rates=()):
    """(the table, the cells it was not fitted to that every run reached, those within WITHIN):
    a row per row and target that the row reached in every unlimited run (N is known)."""
    workers, rates = settings["workers"], decision_table.rates_of(runs)
    measured = {label for label, _ in rates}
    extra = [r for r in extra_rates if r[0] not in measured]
    lines = ["| row | target | p (ms) | b (kB) | N | " + " | ".join(
        "predicted / measured s, %s" % command_line.format_rate(bits) for _, bits in rates)
        + "".join(" | predicted s, %s" % command_line.format_rate(bits) for _, bits in extra)
        + " |", "|---|---|---|---|---|" + "---|" * (len(rates) + len(extra))]
    held_out = right = 0
    unknown = []
    for share, target in decision_table.targets(settings):
        c, fitted = fit(runs, target, workers)
        for label, q in fitted.items():
            if q["N"] is None:
                unknown.append("%s to %.3f" % (label, target))
                continue
            cells = []
            for rate, bits in rates:
                text, error = cell_text(predict(c, q, workers, bits), runs, label, rate, target)
                if bits is not None and error is not None:  # a cell the model was not fitted to
                    held_out += 1
                    right += abs(error) <= WITHIN
                cells.append(text)
            cells += ["%.1f" % predict(c, q, workers, bits) for _, bits in extra]
            lines.append("| %s | %s | %.0f | %.1f | %.0f | %s |" % (
                label, decision_table.target_name(share, target), 1e3 * q["p"],
                (q["b"] or 0) / 1e3, q["N"], " | ".join(cells)))
    summary = ("c = %.1f ms a mini-batch on one host; W = %d. Fitted on the unlimited links "
               "only; the cells at every other rate are predictions: %d of %d of those where "
               "every run reached the target are within %d%% of the measured median (%s). No "
               "N, so no row, where not every unlimited run reached the target: %s. Written by "
               "`python benchmarks/step_time_model.py`, from %s."
               % (1e3 * c, workers, right, held_out, round(100 * WITHIN),
                  "%.0f%%" % (100.0 * right / held_out) if held_out else "none to judge",
                  ", ".join(unknown) or "none", decision_table.RUNS))
    return "\n".join(lines + ["", summary]), held_out, right


def evaluate_other_workers(runs, settings, other_runs, other_settings):
    """The model fitted on runs (settings["workers"] workers) predicts the cells of other_runs,
    measured with another worker count: (the table, its cells judged, those within WITHIN)."""
    workers = other_settings["workers"]
    lines = ["| row | target | links | predicted / measured s, %d workers |" % workers,
             "|---|---|---|---|"]
    judged = right = 0
    for share, target in decision_table.targets(settings):
        c, fitted = fit(runs, target, settings["workers"])
        for label in decision_table.labels_of(other_runs):
            if label not in fitted or fitted[label]["N"] is None:
                continue
            for rate, bits in decision_table.rates_of(other_runs):
                text, error = cell_text(predict(c, fitted[label], workers, bits), other_runs,
                                        label, rate, target)
                if error is not None:
                    judged += 1
                    right += abs(error) <= WITHIN
                lines.append("| %s | %s | %s | %s |" % (
                    label, decision_table.target_name(share, target),
                    command_line.format_rate(bits), text))
    lines += ["", "The same fit (%d workers) predicts %d workers: %d of %d of the cells where "
              "every run reached the target are within %d%% of the measured median. Measured "
              "with `%s`." % (settings["workers"], workers, right, judged, round(100 * WITHIN),
                              other_settings["command"])]
    return "\n".join(lines), judged, right


def report(runs_path, predict_rates="20mbit", other_workers=""):
    """The model's tables: the runs file's cells, and other_workers' (a runs file measured with
    another worker count) if given."""
    extra = command_line.parse_rates(predict_rates) if predict_rates else []
    try:
        settings, _, runs = decision_table.load_runs(runs_path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError("%s: %s" % (runs_path, e))
    text, _, _ = evaluate(runs, settings, extra)
    if other_workers:
        try:
            other_settings, _, other_runs = decision_table.load_runs(other_workers)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError("--other_workers %s: %s" % (other_workers, e))
        text += "\n\n" + evaluate_other_workers(runs, settings, other_runs, other_settings)[0]
    return text


def main(argv=None, prog="step_time_model.py"):
    p = example_runs.argparse_for(prog, __doc__)
    p.add_argument("--runs", default=PUBLISHED,
                   help="the decision table's runs file (default: the published one)")
    p.add_argument("--predict", default="20mbit", metavar="RATES",
                   help="rates to predict at as well, not measured (default: 20mbit)")
    p.add_argument("--other_workers", default=OTHER_WORKERS if os.path.exists(OTHER_WORKERS)
                   else "", metavar="RUNS",
                   help="a runs file of the same table measured with another worker count, "
                        "to predict as well (default: the published one with 2 workers, if any)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = report(args.runs, args.predict, args.other_workers)
    except (OSError, ValueError, KeyError) as e:
        return command_line.error("%s (run benchmarks/decision_table.py first)" % e)
    print(text)
    if (os.path.abspath(args.runs) == PUBLISHED and args.predict == "20mbit"
            and args.other_workers == (OTHER_WORKERS if os.path.exists(OTHER_WORKERS) else "")):
        published_tables.publish("step_time_model.py#mnist1d", text,
                                 [published_tables.BENCHMARKS_README])
    return 0


if __name__ == "__main__":
    sys.exit(main())
