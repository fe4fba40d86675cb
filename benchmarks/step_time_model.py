"""A step-time model that predicts the decision table's cells from a few quantities measured once.

    python benchmarks/step_time_model.py                 # from the decision table's runs files
    python benchmarks/step_time_model.py --predict 5mbit,1gbit   # and at rates not measured

Which scheme reaches the target first depends on the cluster: how fast a host computes, how fast
its links are, how many workers there are. Running every scheme on every cluster is what a
reader cannot do, so this model predicts a scheme's seconds to the target from quantities each
measured once:

    c    one host's compute time per mini-batch: 1 / the one-process SGD run's mini-batches per
         second (the same host, the same model and batch)
    W    the workers
    p    the scheme's own work per mini-batch beyond computing it on W hosts at once (the ps's
         update, the messages at full speed, waiting): 1 / its mini-batches per second on
         unlimited links with W workers, minus c / W
    b    the scheme's bytes per mini-batch on its busiest link, both directions (cluster.py's
         interface counters, on unlimited links with W workers)
    s    the share of those bytes a mini-batch waits for: the rest crosses the link while the
         hosts compute, or while the other direction is busy. Measured once per scheme, from its
         mini-batches per second at one limited rate (100 Mbit/s, 3 workers):
         s = (1 / rate there - 1 / rate unlimited) * R / (8 b)
    N    the mini-batches it needs to reach the target: its seconds to the target on unlimited
         links with W workers times its mini-batches per second there (the median of its runs)

    seconds to the target at link rate R with W workers  =  N * (c / W + p + 8 s b / R)

The seconds to the target at the rate s is measured at are shown, but they are not counted as
predictions (that rate was fitted). The model is judged on the cells of the other runs files
(--held_out): other link rates, and other worker counts with the rate term s carried over from
3 workers. Each is also predicted by the rule published before those runs were measured, which
counted every byte of the busier direction (both directions for the synchronous ps schemes) as
waited for: 8 b' / R in place of 8 s b / R.
"""
import os
import statistics
import sys

import command_line  # link rates and the one-line error
import decision_table  # the runs file, the rows, the target and the cells
import example_runs
import published_tables

SYNCHRONOUS_PS = {"Sync-SGD", "EASGD", "DiLoCo", decision_table.LOCAL_SGD, "Gradient-Compression"}
WITHIN = 0.25  # a prediction within 25% of the measured median counts as right
FITTED_RATE = "100mbit"  # the one limited rate s is measured at, with the main file's workers
MNIST1D = os.path.join(published_tables.RESULTS, "mnist1d")
PUBLISHED = os.path.join(MNIST1D, decision_table.RUNS)
HELD_OUT = [os.path.join(MNIST1D, folder, decision_table.RUNS) for folder in ("rate20", "workers2")]
# Runs of a held-out file measured before the rule was committed (9e83a7a), whose errors prompted
# it: the first 100 Mbit/s run (repeat 0) of five rows with 2 workers. They are not held out, so
# the judgement leaves them out; those cells are judged on the runs measured after the rule.
SEEN_BY_THE_RULE = {HELD_OUT[1]: dict(rate="100mbit", repeat=0, rows=(
    "ADAG", "DiLoCo", decision_table.LOCAL_SGD, "DynSGD", "Gradient-Compression"))}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def per_mini_batch(run, key):
    if not run.get(key) or not run.get("mini_batches"):
        return None
    return run[key] / run["mini_batches"]


def counted_bytes(run):
    """The earlier rule's bytes per mini-batch: the busier direction of the busiest link, both
    directions where a synchronous round's reads and writes take turns."""
    if run["row"] in SYNCHRONOUS_PS and run.get("busiest_both"):
        return per_mini_batch(run, "busiest_both")
    return per_mini_batch(run, "busiest_bytes")


def mini_batches_to(run, target):
    """The mini-batches the run took to reach target (None: it never did)."""
    seconds = decision_table.seconds_to(run, target)
    if seconds is None or not run.get("mini_batches_per_sec"):
        return None
    return seconds * run["mini_batches_per_sec"]


def fit(runs, target, workers):
    """The quantities measured on unlimited links: c, and per distributed row p, b (both
    directions), b' (the earlier rule's bytes) and N (None where not every unlimited run reached
    the target)."""
    one_host = [r for r in runs if r["row"] == decision_table.ONE_SGD and not r["overran"]]
    if not one_host:
        raise ValueError("no %r runs to measure c, one host's time a mini-batch, from"
                         % decision_table.ONE_SGD)
    c = 1.0 / median(r["mini_batches_per_sec"] for r in one_host)
    fitted = {}
    for label in decision_table.labels_of(runs):
        unlimited = [r for r in runs if r["row"] == label and r["rate"] == "unlimited"
                     and not r["overran"]]
        if not unlimited:
            continue
        rate = median(r["mini_batches_per_sec"] for r in unlimited)
        reached = [n for n in (mini_batches_to(r, target) for r in unlimited) if n is not None]
        fitted[label] = dict(p=1.0 / rate - c / workers,
                             b=median(per_mini_batch(r, "busiest_both") for r in unlimited),
                             counted=median(map(counted_bytes, unlimited)),
                             N=median(reached) if len(reached) == len(unlimited) else None,
                             mini_batches_per_sec=rate, s=None)
    return c, fitted


def fit_waiting(runs, fitted, rate=FITTED_RATE):
    """Sets each row's s, the share of its bytes a mini-batch waits for, from its median
    mini-batches per second at rate (a row not run there keeps s None)."""
    for label, q in fitted.items():
        limited = [r for r in runs if r["row"] == label and r["rate"] == rate
                   and not r["overran"]]
        if not limited or not q["b"]:
            continue
        wire = 1.0 / median(r["mini_batches_per_sec"] for r in limited) \
            - 1.0 / q["mini_batches_per_sec"]
        q["s"] = wire * limited[0]["bits"] / (8.0 * q["b"])
    return fitted


def predict(c, quantities, workers, bits, rule="waited"):
    """Seconds to the target at bits per second (None: unlimited) with workers workers, by the
    waited share (rule "waited") or by every counted byte (rule "counted", the earlier rule)."""
    if quantities["N"] is None:
        return None
    if bits is None:
        wire = 0.0
    elif rule == "counted":
        if quantities["counted"] is None:
            return None
        wire = 8.0 * quantities["counted"] / bits
    else:
        if quantities["s"] is None or quantities["b"] is None:
            return None
        wire = 8.0 * quantities["s"] * quantities["b"] / bits
    return quantities["N"] * (c / workers + quantities["p"] + wire)


def judged(predicted, runs, label, rate, target):
    """(measured median seconds, the cell's text) where every run reached the target and
    there is a prediction, else (None, the cell's text)."""
    seconds, k, n = decision_table.median_seconds(runs, label, rate, target)
    if not n:
        return None, "not run"
    if predicted is None or seconds is None or k < n:
        return None, decision_table.cell([decision_table.seconds_to(r, target)
                                          for r in decision_table.cell_runs(runs, label, rate)])
    return seconds, "%.1f" % seconds


def versus(predicted, seconds):
    if predicted is None:
        return "-"
    if seconds is None:
        return "%.1f" % predicted
    return "%.1f (%+.0f%%)" % (predicted, 100 * (predicted / seconds - 1))


def mini_batches_taken(runs, label, rate, target, quantities):
    """The median mini-batches the cell's runs took to the target, against the N predicted with
    (the part of an error no rate term can mend: N varies from run to run)."""
    taken = median(mini_batches_to(r, target) for r in decision_table.cell_runs(runs, label, rate))
    if taken is None:
        return "-"
    return "%.0f (%+.0f%%)" % (taken, 100 * (quantities["N"] / taken - 1))


def within(predicted, seconds):
    return abs(predicted / seconds - 1) <= WITHIN


def evaluate(runs, settings, extra_rates=()):
    """The fitted quantities, and each row's cells in the runs it was fitted on: (the table,
    [(target, c, fitted)])."""
    workers, rates = settings["workers"], decision_table.rates_of(runs)
    measured = {label for label, _ in rates}
    extra = [r for r in extra_rates if r[0] not in measured]
    lines = ["| row | target | p (ms) | b (kB) | s | N | " + " | ".join(
        "predicted / measured s, %s" % command_line.format_rate(bits) for _, bits in rates)
        + "".join(" | predicted s, %s" % command_line.format_rate(bits) for _, bits in extra)
        + " |", "|---|---|---|---|---|---|" + "---|" * (len(rates) + len(extra))]
    fits, unknown = [], []
    for share, target in decision_table.targets(settings):
        c, fitted = fit(runs, target, workers)
        fit_waiting(runs, fitted)
        fits.append((target, c, fitted))
        for label, q in fitted.items():
            if q["N"] is None:
                unknown.append("%s to %.3f" % (label, target))
                continue
            cells = []
            for rate, bits in rates:
                predicted = predict(c, q, workers, bits)
                seconds, text = judged(predicted, runs, label, rate, target)
                cells.append("%s / %s" % ("%.1f" % predicted if predicted else "-", text)
                             + (" (%+.0f%%)" % (100 * (predicted / seconds - 1))
                                if seconds else ""))
            cells += [versus(predict(c, q, workers, bits), None) for _, bits in extra]
            lines.append("| %s | %s | %.0f | %.1f | %s | %.0f | %s |" % (
                label, decision_table.target_name(share, target), 1e3 * q["p"],
                (q["b"] or 0) / 1e3, "%.2f" % q["s"] if q["s"] is not None else "-", q["N"],
                " | ".join(cells)))
    summary = ("c = %.1f ms a mini-batch on one host; W = %d. p, b and N are measured on the "
               "unlimited links, s at %s: the seconds to the target there differ from the "
               "prediction only by the N the runs took. No N, so no row, where not every "
               "unlimited run reached the target: %s. Written by `python "
               "benchmarks/step_time_model.py`, from %s."
               % (1e3 * fits[0][1], workers, command_line.format_rate(
                   command_line.parse_rates(FITTED_RATE)[0][1]),
                  ", ".join(unknown) or "none", decision_table.RUNS))
    return "\n".join(lines + ["", summary]), fits


def evaluate_held_out(fits, main_settings, runs, settings, where):
    """The cells of a runs file the model was not fitted to (another rate, or another worker
    count, whose unlimited runs give N, p and b there): (the table's lines, judged, within by
    the model, within by the earlier rule)."""
    workers = settings["workers"]
    own_unlimited = any(r["rate"] == "unlimited" for r in runs)
    if not own_unlimited and workers != main_settings["workers"]:
        raise ValueError("%s: %d workers and no unlimited runs to measure N at" % (where, workers))
    lines, judged_cells, right, right_before = [], 0, 0, 0
    for (share, target), (_, c, main_fit) in zip(decision_table.targets(main_settings), fits):
        fitted = main_fit
        if own_unlimited:
            c, fitted = fit(runs, target, workers)
            for label, q in fitted.items():
                q["s"] = main_fit.get(label, {}).get("s")
        for label in decision_table.labels_of(runs):
            q = fitted.get(label)
            if q is None or q["N"] is None:
                continue
            for rate, bits in decision_table.rates_of(runs):
                if bits is None:
                    continue
                now, before = predict(c, q, workers, bits), predict(c, q, workers, bits,
                                                                     "counted")
                seconds, text = judged(now, runs, label, rate, target)
                if seconds is not None:
                    judged_cells += 1
                    right += within(now, seconds)
                    right_before += within(before, seconds)
                lines.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                    label, decision_table.target_name(share, target), workers,
                    command_line.format_rate(bits), text, versus(now, seconds),
                    versus(before, seconds), mini_batches_taken(runs, label, rate, target, q)))
    return lines, judged_cells, right, right_before


def unseen_by_the_rule(runs, path):
    """The runs of a held-out file less those the rule saw before it was committed
    (SEEN_BY_THE_RULE), and how many were left out."""
    seen = SEEN_BY_THE_RULE.get(os.path.abspath(path))
    kept = [r for r in runs if not seen or not (
        r["row"] in seen["rows"] and r["rate"] == seen["rate"] and r["repeat"] == seen["repeat"])]
    return kept, len(runs) - len(kept)


def report(runs_path, predict_rates="5mbit", held_out=()):
    """The model's tables: the runs file it is fitted on, and the held-out runs files'."""
    extra = command_line.parse_rates(predict_rates) if predict_rates else []
    try:
        settings, _, runs = decision_table.load_runs(runs_path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError("%s: %s" % (runs_path, e))
    text, fits = evaluate(runs, settings, extra)
    if not held_out:
        return text
    lines = ["| row | target | workers | links | measured s | predicted s | predicted s, "
             "the earlier rule | mini-batches taken (N against it) |",
             "|---|---|---|---|---|---|---|---|"]
    judged_cells = right = right_before = left_out = 0
    commands = []
    for path in held_out:
        try:
            other_settings, _, other_runs = decision_table.load_runs(path)
            other_runs, seen = unseen_by_the_rule(other_runs, path)
            more, n, k, k_before = evaluate_held_out(fits, settings, other_runs, other_settings,
                                                     path)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError("--held_out %s: %s" % (path, e))
        left_out += seen
        lines += more
        judged_cells, right, right_before = judged_cells + n, right + k, right_before + k_before
        commands.append("`%s`" % other_settings["command"])
    share = "%.0f%%" % (100.0 * right / judged_cells) if judged_cells else "none to judge"
    lines += ["", "Cells the model was not fitted to, where every run reached the target: %d of "
              "%d within %d%% of the measured median (%s); the earlier rule, %d of %d.%s Measured "
              "with %s." % (right, judged_cells, round(100 * WITHIN), share, right_before,
                            judged_cells, seen_sentence(left_out), " and ".join(commands))]
    return text + "\n\n" + "\n".join(lines)


def seen_sentence(left_out):
    if not left_out:
        return ""
    seen = next(iter(SEEN_BY_THE_RULE.values()))
    return (" Left out: %d run(s) measured before the rule was committed, which prompted it (the "
            "first %s run of %s, 2 workers); their cells are judged on the runs after it."
            % (left_out, command_line.format_rate(command_line.parse_rates(seen["rate"])[0][1]),
               ", ".join(seen["rows"])))


def published_held_out():
    return [path for path in HELD_OUT if os.path.exists(path)]


def main(argv=None, prog="step_time_model.py"):
    p = example_runs.argparse_for(prog, __doc__)
    p.add_argument("--runs", default=PUBLISHED,
                   help="the decision table's runs file it is fitted on (default: the "
                        "published one)")
    p.add_argument("--predict", default="5mbit", metavar="RATES",
                   help="rates to predict at as well, not measured (default: 5mbit)")
    p.add_argument("--held_out", default=",".join(published_held_out()), metavar="RUNS",
                   help="comma-separated runs files of the same table at other rates or worker "
                        "counts, to judge it on (default: the published ones)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    held_out = [path for path in args.held_out.split(",") if path]
    try:
        text = report(args.runs, args.predict, held_out)
    except (OSError, ValueError, KeyError) as e:
        return command_line.error("%s (run benchmarks/decision_table.py first)" % e)
    print(text)
    if (os.path.abspath(args.runs) == PUBLISHED and args.predict == "5mbit"
            and held_out == published_held_out()):
        published_tables.publish("step_time_model.py#mnist1d", text,
                                 [published_tables.BENCHMARKS_README])
    return 0


if __name__ == "__main__":
    sys.exit(main())
