"""How most benchmarks run an example and read its results: compare.py, bandwidth.py,
window_sweep.py, scaling.py, ps_sweep.py and pipeline.py (sparse_embeddings.py takes only its
command line). throughput.py and stragglers.py start the example's run.sh themselves: one
example on localhost, its summary line read back. compression.py, step_anatomy.py and
gpu_check.py build an example's graph in their own process instead (load_example).

A run is either the example's own run.sh on localhost, what a user runs first, or
benchmarks/cluster.py, every task a host of its own behind links of a given rate. Either way
its output goes to --out/logs/<tag>.log (the first line is the command) and the chief's
metrics to --out/logs/<tag>.json, which --from_logs reads back to redraw the tables and plots
without training again. The metrics are what the chief's summary line and its TensorBoard
events say (metrics_of, the one reader of a run's results; cluster.py writes them with its own
report), nothing an example writes for the benchmarks alone.
"""
import argparse
import glob
import importlib.util
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading

import command_line  # link rates and the one-line error
import published_tables  # where the published figures live
import problems  # benchmarks/problems.py: the digits or MNIST-1D

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER_PY = os.path.join(ROOT, "benchmarks", "cluster.py")
BASELINE = "Non-Distributed-Setup"
TARGET = 0.95  # the test accuracy "seconds to" counts to (tests/conftest.py's ACCURACY_BAR)
# each problem's: MNIST-1D's, where one process (Non-Distributed-Setup's defaults) first
# reaches it after about 1250 mini-batches and levels off at 0.58-0.59 from 1500 on
TARGETS = {"digits": TARGET, "mnist1d": 0.55}
STOP_SECS = 60  # a stopped run's time to stop its tasks (and cluster.py's to remove namespaces)


def free_addresses(count):
    """count localhost:PORT addresses free now, below the kernel's ephemeral ports (one picked
    among those could be handed to a client's connection before its server binds it), each
    probe kept bound until all are picked: for the benchmarks that start their own servers."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_from = int(f.read().split()[0])
    probes = []
    for port in random.sample(range(10000, ephemeral_from), ephemeral_from - 10000):
        probe = socket.socket()
        try:
            probe.bind(("localhost", port))
        except OSError:  # in use
            probe.close()
            continue
        probes.append(probe)
        if len(probes) == count:
            break
    addresses = ["localhost:%d" % probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return addresses


class PeakMemory(object):
    """While in its with block: the peak resident memory (VmHWM, in kB) of each process that
    role_of(pid) names, by that name (None: not one to watch), read from /proc twice a second."""

    def __init__(self, role_of):
        self.role_of, self.peak, self.done = role_of, {}, threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(5)

    def watch(self):
        while not self.done.wait(0.5):
            for pid in os.listdir("/proc"):
                role = self.role_of(pid) if pid.isdigit() else None
                if role is not None:
                    kb = status_kb(pid, "VmHWM")
                    if kb:
                        self.peak[role] = max(self.peak.get(role, 0), kb)


def status_kb(pid, key):
    """A /proc/PID/status field in kB (None: gone, or no such field)."""
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def examples():
    """Every folder with a train.py and a run.sh that trains on the digits, the baseline first."""
    found = sorted(d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "run.sh"))
                   and os.path.isfile(os.path.join(ROOT, d, "train.py")) and on_the_digits(d))
    return [BASELINE] + [d for d in found if d != BASELINE]


def load_example(example, name="train"):
    """An example's train.py as a module named name (in sys.modules too), for a benchmark that
    builds the example's graph in its own process; the example's main() runs only if called."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, example, "train.py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_the_digits(example):
    """Whether an example trains on the digits, the problem the benchmarks compare on: its
    train.py carries the shared data block, or the baseline's way in, the shared npz block
    alone (the digits by default, --data_path's .npz otherwise). Sparse-Embeddings has clicks
    of its own, another model and another measure (AUC), and benchmarks/sparse_embeddings.py of
    its own."""
    with open(os.path.join(ROOT, example, "train.py")) as f:
        text = f.read()
    return "# >>> shared: data\n" in text or "# >>> shared: npz\n" in text


def select_examples(text):
    """--examples DOWNPOUR,Sync-SGD -> the baseline and those, in the usual order; empty: all.
    The baseline always runs: it is what every distributed example is measured against."""
    names = examples()
    if not text:
        return names
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in names]
    if unknown:
        raise ValueError("--examples: no example named %s; choose from %s"
                         % (", ".join(unknown), ",".join(names[1:])))
    return [name for name in names if name == BASELINE or name in chosen]


def add_run_flags(p, steps=3000, eval_every=50, problem=False):
    """The flags every benchmark that trains the examples shares; with problem, --problem too.
    Parse them with parse_run_flags."""
    if problem:
        p.add_argument("--problem", choices=problems.PROBLEMS, default="digits",
                       help="what every example trains on: the digits, or MNIST-1D through "
                            "--data_path (made once, cached in benchmarks/data) (default: %(default)s)")
    p.add_argument("--out", default=None,
                   help="output folder (default: benchmarks/results; with --problem mnist1d, "
                        "benchmarks/results/mnist1d)")
    p.add_argument("--steps", type=int, default=steps,
                   help="mini-batches per run, summed over the workers (default: %d)" % steps)
    p.add_argument("--batch_size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--eval_every", type=int, default=eval_every,
                   help="the chief's test-accuracy interval in its local steps (default: %d)"
                        % eval_every)
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds a run may take (default: %(default)g)")
    p.add_argument("--from_logs", action="store_true",
                   help="rebuild the tables and plots from the metrics an earlier run left in "
                        "--out/logs, without training (give the same options)")


def parse_run_flags(p, argv):
    """The parsed flags of add_run_flags, settled: args.problem (digits where the script has no
    --problem), args.out and args.target (the accuracy "seconds to" counts to). The data comes
    later, from make_data, once the script has checked its own flags."""
    args = p.parse_args(argv)
    args.problem = getattr(args, "problem", "digits")
    if args.out is None:
        args.out = results_folder(args.problem)
    if getattr(args, "target", None) is None:  # a script's own --target wins
        args.target = TARGETS[args.problem]
    return args


def make_data(args):
    """Set args.data_path, what every run gets as --data_path: "" for the digits, the cached
    MNIST-1D file for mnist1d, made now if it is not there (seconds). Call it after the
    script's own flag checks, so that a wrong flag stops in one line before anything is made;
    RuntimeError (in one line) where the data cannot be made."""
    args.data_path = problems.data_path(args.problem)


def results_folder(problem):
    """Where a problem's tables and plots go unless --out says otherwise."""
    if problem == "digits":
        return published_tables.RESULTS
    return os.path.join(published_tables.RESULTS, problem)


def run_example(example, workers, args, tag, train_args=(), bandwidth=None, who="compare",
                cpus=None, ps=None, seed=None, timeout_is_a_result=False):
    """One run of example with workers workers; returns the chief's metrics.

    bandwidth None: the example's run.sh on localhost. A rate as cluster.py takes it
    (unlimited, 20mbit): cluster.py, whose report is then in the metrics under "cluster"; with
    cpus, each of its hosts capped at that many cores (cluster.py --cpus); with ps, that many
    parameter servers (cluster.py --ps; run.sh's NUM_PS on localhost). Every
    run gets --steps, --batch_size, --seed, --log_every (--eval_every) and --data_path (the
    problem's) from args (seed, if given, instead of args.seed), then train_args. A run that
    fails runs once more (its log kept as <tag>-failed.log); a second failure stops the
    benchmark with the name of its log. With timeout_is_a_result, a run that
    overruns --timeout returns None instead, and is not run again (a time-to-accuracy benchmark
    counts it as not reached).
    """
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path, metrics_path = (os.path.join(logs, tag + ext) for ext in (".log", ".json"))
    if args.from_logs:  # redraw from an earlier run's metrics, without training again
        return logged_metrics(who, example, tag, log_path, metrics_path, timeout_is_a_result)
    tensorboard = os.path.join(logs, tag + "-tensorboard")
    clear_earlier_run(tensorboard, metrics_path)
    common = ["--steps", str(args.steps), "--batch_size", str(args.batch_size),
              "--log_every", str(args.eval_every),
              "--seed", str(args.seed if seed is None else seed)]
    if args.data_path:  # MNIST-1D (make_data set it); the examples' own Data stays the digits
        common += ["--data_path", args.data_path]
    common += list(train_args)
    env, timeout = dict(os.environ), args.timeout
    if bandwidth is None:
        command = (["bash", os.path.join(ROOT, example, "run.sh")] + common
                   + ["--log_dir", tensorboard])
        env["NUM_WORKERS"] = str(workers)
        if ps:
            env["NUM_PS"] = str(ps)
    else:  # cluster.py bounds the run, writes the metrics with its report, removes what it made
        command = ([sys.executable, CLUSTER_PY, example, "--workers", str(workers),
                    "--bandwidth", bandwidth, "--timeout", str(args.timeout)]
                   + (["--cpus", str(cpus)] if cpus else []) + (["--ps", str(ps)] if ps else [])
                   + ["--log_dir", tensorboard, "--metrics_file", metrics_path]
                   + ["--"] + common)
        timeout += STOP_SECS
    for attempt in (1, 2):  # a run that fails is run once more: a rare transient can end one
        with open(log_path, "w") as log:
            log.write("$ %s\n" % " ".join(shlex.quote(c) for c in command))
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # so a timeout can stop all of it
            try:
                code = wait_or_stop(proc, timeout)
            except KeyboardInterrupt:
                print("%s: interrupted: stopped %s's run (its log: %s)" % (who, example, log_path),
                      file=sys.stderr, flush=True)
                sys.exit(128 + signal.SIGINT)
        if code == 0 and bandwidth is None:
            metrics = recorded_metrics(log_path, tensorboard, metrics_path)
            if metrics is not None:
                return metrics
        elif code == 0 and os.path.exists(metrics_path):
            return read_metrics(metrics_path)
        if code is None and timeout_is_a_result:
            print("%s: %s with %d worker(s) overran %.0f s: not reached (its log: %s)"
                  % (who, example, workers, timeout, log_path), file=sys.stderr, flush=True)
            return None
        if code is None:
            why = "timed out after %.0f s" % timeout
        elif code == 0:
            why = "exit 0, but no summary line from the chief"
        else:
            why = "exit %d" % code
        failure = "%s: %s with %d worker(s)%s failed (%s); see %s" % (
            who, example, workers, "" if bandwidth is None else " at " + bandwidth, why, log_path)
        if attempt == 2:
            sys.exit(failure)
        failed_log = log_path[:-len(".log")] + "-failed.log"
        os.replace(log_path, failed_log)
        print(failure.replace(log_path, failed_log) + "; running it once more", file=sys.stderr,
              flush=True)
        shutil.rmtree(tensorboard, ignore_errors=True)


def logged_metrics(who, example, tag, log_path, metrics_path, timeout_is_a_result=False):
    """An earlier run's metrics, for a redraw (--from_logs); None for a run that overran its
    timeout (with timeout_is_a_result); a run that never ran stops the redraw in one line."""
    if os.path.exists(metrics_path):
        return read_metrics(metrics_path)
    if not os.path.exists(log_path):  # never run
        sys.exit("%s: --from_logs: %s has no run %s (no %s); run it first, without "
                 "--from_logs" % (who, example, tag, os.path.relpath(log_path)))
    if timeout_is_a_result:
        return None
    sys.exit("%s: --from_logs: %s's run %s left no metrics (see %s); run it again, without "
             "--from_logs" % (who, example, tag, os.path.relpath(log_path)))


def clear_earlier_run(tensorboard, metrics_path):
    """Remove what an earlier run of the same tag left: its checkpoint would make this run
    resume at its last step (and train nothing), and a failed run must not leave the earlier
    run's figures behind."""
    shutil.rmtree(tensorboard, ignore_errors=True)
    if os.path.exists(metrics_path):
        os.remove(metrics_path)


def read_metrics(path):
    with open(path) as f:
        return json.load(f)


# --- What a run left: the chief's summary line and its TensorBoard events ------------------------
LIST_FIELDS = ("local_steps", "stage_busy")  # lists even with one worker or one stage


def summary_fields(output):
    """The chief's summary line, the last `[ROLE] summary key=value ...` line of output (a
    cluster.py run's own `[cluster] summary` left out), as a dict: whole numbers as int, other
    numbers as float, comma-separated values (and LIST_FIELDS always) as lists, anything else as
    text. None where output has no summary line: the run failed before its end."""
    lines = [line for line in output.splitlines()
             if "] summary " in line and not line.startswith("[cluster] ")]
    if not lines:
        return None

    def value(text):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text
    fields = {}
    for pair in lines[-1].split("] summary ", 1)[1].split():
        key, _, text = pair.partition("=")
        items = [value(item) for item in text.split(",")]
        if key in LIST_FIELDS or len(items) > 1:
            fields[key] = items
        else:
            fields[key] = items[0]
    return fields


def scalars(log_dir):
    """The TensorBoard scalars in log_dir's event files (its subfolders' too: Keras-Fit writes
    there): {tag: [(wall_time, step, value), ...]}, each tag's in order of wall time; {} where
    there are none. tf.compat.v1 summaries hold a simple_value, TensorFlow 2's a scalar
    tensor."""
    paths = glob.glob(os.path.join(log_dir, "**", "events.out.tfevents*"), recursive=True)
    if not paths:
        return {}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    import tensorflow as tf  # only here: a benchmark that reads no events loads no TensorFlow
    found = {}
    for path in sorted(paths):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                number = (v.simple_value if v.HasField("simple_value")
                          else float(tf.make_ndarray(v.tensor)))
                found.setdefault(v.tag, []).append((event.wall_time, int(event.step), number))
    return {tag: sorted(values) for tag, values in found.items()}


def metrics_of(output, log_dir):
    """The chief's metrics from what its run left: its summary line in output and its
    TensorBoard events in log_dir. None where output has no summary line (the run failed).

    Returns summary_fields(output), plus "history": one row [seconds, global step, test metric,
    ...] per evaluation (each progress line's, and the end's), the metrics in the summary's
    order (test_accuracy first), from the events tagged test_NAME; rows before the run's start
    step (global_step - updates: an earlier run in the same log_dir) are left out.

    The events carry wall times, not the run's clock, which starts as the first update returns
    (set-up untimed). So a row's seconds count from an estimate of that start: the first row's
    wall time less (its step - the start step) / the run's pace in global steps a second. The
    pace is the rows' own, their steps over their wall time, from the first row to the last
    before the end's (which also waits for the other workers), or to the end's where fewer rows
    came before it: the summary's steps_per_sec counts mini-batches, the global steps' pace only
    where one update is one mini-batch (not in the windowed and synchronous examples). Where the
    end's is the only row (no progress line came before it), steps_per_sec stands in."""
    metrics = summary_fields(output)
    if metrics is None:
        return None
    found = scalars(log_dir)
    names = [key for key in metrics if key.startswith("test_") and key in found]
    start_step = metrics.get("global_step", 0) - metrics.get("updates", 0)
    columns = [[(t, step, v) for t, step, v in found[name] if step >= start_step]
               for name in names]
    rows = list(zip(*columns))  # the k-th evaluation wrote each metric once
    history = []
    if rows:
        pace = global_steps_per_sec(rows[:-1]) or global_steps_per_sec(rows) or metrics.get(
            "steps_per_sec")
        first_time, first_step, _ = rows[0][0]
        start = first_time - ((first_step - start_step) / pace if pace else 0.0)
        history = [[round(row[0][0] - start, 3), row[0][1]] + [v for _, _, v in row]
                   for row in rows]
    metrics["history"] = history
    return metrics


def global_steps_per_sec(rows):
    """The global steps a second from the first of rows to the last (each row the evaluation's
    (wall time, step, value) per metric); None where they span no step or no time."""
    if len(rows) < 2:
        return None
    (first_time, first_step, _), (last_time, last_step, _) = rows[0][0], rows[-1][0]
    if last_step <= first_step or last_time <= first_time:
        return None
    return (last_step - first_step) / (last_time - first_time)


def recorded_metrics(log_path, log_dir, metrics_path):
    """metrics_of the run whose output is in log_path and whose chief wrote log_dir, written to
    metrics_path as well (what --from_logs reads back); None, and nothing written, where the
    output has no summary line."""
    with open(log_path, errors="replace") as f:
        metrics = metrics_of(f.read(), log_dir)
    if metrics is not None:
        with open(metrics_path, "w") as f:
            json.dump(metrics, f, indent=1)
    return metrics


def wait_or_stop(proc, timeout):
    """The run's exit status, or None if it timed out. Past timeout, or on Ctrl-C here (the run
    is in a session of its own, so it did not see it), stop it first."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return None
    except BaseException:
        stop(proc)
        raise


def stop(proc):
    """SIGINT to the run's process group: run.sh and cluster.py both stop every task on it
    (cluster.py removes its namespaces too); SIGKILL if it has not ended after STOP_SECS."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_SECS)
            return
        except subprocess.TimeoutExpired:
            continue


def time_to_target(metrics, target=TARGET):
    """Seconds from the chief's start until the test accuracy first reached target."""
    for seconds, _, accuracy, *_ in metrics["history"]:  # the first metric: test_accuracy
        if accuracy >= target:
            return seconds
    return None


def mini_batches_per_sec(metrics):
    """All workers' mini-batches a second over the training loop (the chief's count)."""
    return metrics["steps_per_sec"]


def examples_per_sec(metrics, batch_size):
    """All workers' training examples a second: mini-batches a second of batch_size each."""
    return mini_batches_per_sec(metrics) * batch_size


def timed_seconds(metrics):
    """The training loop's seconds: the last evaluation's (the chief's end) on the history's
    clock; None without one."""
    return metrics["history"][-1][0] if metrics.get("history") else None


def rerun_command(prog, argv, sudo=False):
    """The command that measures it again: [sudo] python benchmarks/PROG ARGS (a redraw's
    --from_logs left out)."""
    return " ".join(["sudo"] * sudo + ["python", "benchmarks/" + prog]
                    + [shlex.quote(a) for a in argv if a != "--from_logs"])


def publishing(args, quick, published=("digits",)):
    """Only a full run into the default folder updates the figures the READMEs show, and only
    for problems whose sections the script publishes (the digits unless it says more)."""
    problem = getattr(args, "problem", "digits")
    return (problem in published and not quick
            and os.path.abspath(args.out) == results_folder(problem))


def section(name, args):
    """The README section a script's figures go to: compare.py for the digits,
    compare.py#mnist1d for MNIST-1D (kept in results/compare-mnist1d.md)."""
    return name if args.problem == "digits" else "%s#%s" % (name, args.problem)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def line_style(i):
    """The i-th example's line: matplotlib's ten colours, then the same colours dashed, and a
    marker of its own, so twelve examples on one plot stay apart."""
    return {"color": "C%d" % (i % 10), "linestyle": ("-", "--", "-.")[(i // 10) % 3],
            "marker": "osD^vP<>Xh*p"[i % 12]}


def plot_accuracy_against_time(path, histories, title, reference=None, target=TARGET):
    """Test accuracy against wall time, one line per (label, history) in histories (a history:
    [seconds, global step, accuracy] rows), and reference, one more such pair, drawn in grey;
    a dotted line at target."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for i, (label, history) in enumerate(histories):
        ax.plot([h[0] for h in history], [h[2] for h in history], label=label, markersize=4,
                **line_style(i))
    if reference:
        label, history = reference
        ax.plot([h[0] for h in history], [h[2] for h in history], color="gray", linestyle=":",
                linewidth=2.5, label=label)
    ax.axhline(target, color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log")  # from under a second to a minute: the fast ones would overlap
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: "%g" % x))
    ax.set_xlabel("wall time since the chief's session started (s, log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(target - 0.15, min(1.0, target + 0.2))  # the bar and the ground around it
    ax.set_title(title)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def argparse_for(prog, doc, help_command=None):
    """A parser whose usage errors are one `error:` line and exit status 2."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    help_command = help_command or "python benchmarks/%s --help" % prog
    p.error = lambda message: sys.exit(command_line.error("%s (see %s)" % (message, help_command)))
    return p
