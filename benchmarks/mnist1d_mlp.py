"""The MNIST-1D paper's MLP row, reproduced the way a user brings their own model.

    python benchmarks/mnist1d_mlp.py               # 3 seeds of 8000 steps: about 3 min here
    python benchmarks/mnist1d_mlp.py --quick       # 1 seed, 300 steps: a smoke run

Greydanus and Kobak (2020, arXiv:2011.14439, Table 1) report 68% test accuracy on MNIST-1D for
an MLP of 40-100-100-10 with a residual connection around the second layer, trained with Adam
at a learning rate of 1e-2 on batches of 100 for 8000 steps. This script does what
docs/own-model.md asks of a user: it copies Non-Distributed-Setup into a temporary folder,
replaces the copy's Model section (between its "shared: model" markers) with that MLP, and
runs the copy's run.sh on the cached MNIST-1D (benchmarks/problems.py) with --hidden 100
--batch_size 100 --learning_rate 0.01 --steps 8000 --optimizer adamw --weight_decay 0 (Adam:
the example's own optimizer flag, AdamW without its decay). Nothing outside the copy's Model
section changes. The weights start as PyTorch's nn.Linear starts them (uniform in
+-1/sqrt(fan_in), biases too), as in the authors' code.

Reports each seed's final test accuracy (after the last step, as the paper's table does) and
its best over the evaluations every --eval_every steps, the median over the seeds, and whether
the median is within 3 points of 68%. Writes --out/mnist1d_mlp.md (the published table when
--out is the default) and keeps each run's log in --out/logs/.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import problems  # benchmarks/problems.py: the cached MNIST-1D
import published_tables  # the figures reach the READMEs only through here
import example_runs  # stopping a run that overruns, reading what it left

BASELINE = "Non-Distributed-Setup"
PAPER_ACCURACY = 0.68  # Greydanus and Kobak, Table 1, "MLP"
WITHIN = 0.03
BANNER = "# Plumbing shared by every example"
MODEL_BLOCK = re.compile(r"^# >>> shared: model\n.*?^# <<< shared: model\n", re.S | re.M)
ADAM = ["--optimizer", "adamw", "--weight_decay", "0"]  # the paper's optimizer, by the flag

# the paper's MLP, in the shape of the Model section (model_params, model_loss, model_metrics)
PAPER_MLP = '''# >>> shared: model
def model_params(input_shape, hidden, seed, num_classes=10):
    """The MNIST-1D paper's MLP: features -> hidden -> hidden (a residual connection) -> classes,
    each layer started as PyTorch's nn.Linear starts it: uniform in +-1/sqrt(fan_in)."""
    features = int(np.prod(input_shape))
    shapes = {"w1": [features, hidden], "b1": [hidden], "w2": [hidden, hidden], "b2": [hidden],
              "w3": [hidden, num_classes], "b3": [num_classes]}
    fan_in = {"1": features, "2": hidden, "3": hidden}
    params = {}
    for i, (name, shape) in enumerate(shapes.items()):
        bound = 1 / np.sqrt(fan_in[name[1]])
        params[name] = tf.compat.v1.get_variable(
            name, shape, initializer=tf.compat.v1.random_uniform_initializer(
                -bound, bound, seed=seed * 10 + i))
    return params


def model_logits(params, x):
    rows = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])
    h = tf.nn.relu(tf.matmul(rows, params["w1"]) + params["b1"])
    h = h + tf.nn.relu(tf.matmul(h, params["w2"]) + params["b2"])  # the residual connection
    return tf.matmul(h, params["w3"]) + params["b3"]


def model_loss(params, x, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=model_logits(params, x)))


def model_metrics(params, x, y):
    correct = tf.equal(tf.argmax(model_logits(params, x), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}
# <<< shared: model
'''


def copy_with_paper_mlp(destination):
    """Non-Distributed-Setup copied to destination with the paper's MLP as its Model section;
    returns the original train.py's text and the copy's."""
    shutil.copytree(os.path.join(example_runs.ROOT, BASELINE), destination,
                    ignore=shutil.ignore_patterns("logs", "__pycache__"))
    with open(os.path.join(destination, "train.py")) as f:
        original = f.read()
    text, replaced = MODEL_BLOCK.subn(lambda m: PAPER_MLP, original)
    if replaced != 1:
        sys.exit("mnist1d_mlp: %s/train.py no longer has one Model section" % BASELINE)
    with open(os.path.join(destination, "train.py"), "w") as f:
        f.write(text)
    return original, text


def train_args(args, seed, log_dir):
    return ["--data_path", args.data_path, "--hidden", "100", "--batch_size", "100",
            "--learning_rate", "0.01", "--steps", str(args.steps), "--seed", str(seed),
            "--log_every", str(args.eval_every), "--log_dir", log_dir] + ADAM


def run_seed(folder, args, seed):
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    tag = "mnist1d_mlp-seed%d" % seed
    log_path, metrics_path = (os.path.join(logs, tag + ext) for ext in (".log", ".json"))
    if args.from_logs:
        return example_runs.read_metrics(metrics_path)
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    log_dir = os.path.join(folder, "logs", tag)
    command = ["bash", os.path.join(folder, "run.sh")] + train_args(args, seed, log_dir)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code = example_runs.wait_or_stop(proc, args.timeout)
    if code != 0:
        sys.exit("mnist1d_mlp: seed %d %s; see %s" % (
            seed, "timed out" if code is None else "failed (exit %d)" % code, log_path))
    metrics = example_runs.recorded_metrics(log_path, log_dir, metrics_path)
    if metrics is None:
        sys.exit("mnist1d_mlp: seed %d left no summary line; see %s" % (seed, log_path))
    return metrics


def write_table(path, results, settings):
    """results: {seed: metrics}; settings: command, steps and seconds."""
    finals = [m["test_accuracy"] for m in results.values()]
    lines = ["| seed | final test accuracy | best test accuracy (step) |", "|---|---|---|"]
    for seed, m in results.items():
        best = max(m["history"], key=lambda h: h[2])
        lines.append("| %d | %.3f | %.3f (%d) |" % (seed, m["test_accuracy"], best[2], best[1]))
    median = statistics.median(finals)
    verdict = "within" if abs(median - PAPER_ACCURACY) <= WITHIN else "NOT within"
    lines += ["", "Median of the final test accuracy over %d seed(s): %.3f (%.3f-%.3f), against "
              "the paper's %.2f: %s %d points (%+.1f)." % (
                  len(finals), median, min(finals), max(finals), PAPER_ACCURACY, verdict,
                  round(WITHIN * 100), (median - PAPER_ACCURACY) * 100),
              "",
              "`%s`: Non-Distributed-Setup copied, its Model section the paper's MLP "
              "(40-100-100-10, a residual connection) and its optimizer Adam, at learning rate "
              "0.01 on batches of 100 for %d steps, on MNIST-1D (4000 training and 1000 test "
              "signals, the package's defaults); %.0f s on %d CPU core(s)."
              % (settings["command"], settings["steps"], settings["seconds"], os.cpu_count())]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = example_runs.argparse_for("mnist1d_mlp.py", __doc__)
    p.add_argument("--seeds", default="0,1,2", help="(default: 0,1,2)")
    p.add_argument("--steps", type=int, default=8000, help="(default: 8000, the paper's)")
    p.add_argument("--eval_every", type=int, default=500,
                   help="test accuracy every N steps (default: 500)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds a run may take (default: 600)")
    p.add_argument("--out", default=published_tables.RESULTS, help="(default: benchmarks/results)")
    p.add_argument("--from_logs", action="store_true",
                   help="rebuild the table from the last run's metrics in --out/logs")
    p.add_argument("--quick", action="store_true",
                   help="one seed, 300 steps: a smoke run that publishes nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every = "0", 300, 100
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error("--seeds: give whole numbers, e.g. 0,1,2; got %r" % args.seeds)
    if not seeds:
        p.error("--seeds: give at least one seed")
    try:
        args.data_path = problems.data_path("mnist1d")
    except RuntimeError as e:
        p.error(str(e))
    started, results = time.time(), {}
    folder = tempfile.mkdtemp(prefix="mnist1d_mlp-")
    try:
        original, copy = copy_with_paper_mlp(os.path.join(folder, BASELINE))
        assert copy[copy.index(BANNER):] == original[original.index(BANNER):]
        for seed in seeds:
            print("seed %d (%.0f s so far)" % (seed, time.time() - started), file=sys.stderr,
                  flush=True)
            results[seed] = run_seed(os.path.join(folder, BASELINE), args, seed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    settings = dict(command=example_runs.rerun_command("mnist1d_mlp.py", argv), steps=args.steps,
                    seconds=time.time() - started)
    table = write_table(os.path.join(args.out, "mnist1d_mlp.md"), results, settings)
    print(table)
    default_out = os.path.abspath(args.out) == published_tables.RESULTS
    if default_out and not args.quick and not args.from_logs:
        published_tables.publish("mnist1d_mlp.py", table, [published_tables.BENCHMARKS_README])
    return 0


if __name__ == "__main__":
    sys.exit(main())
