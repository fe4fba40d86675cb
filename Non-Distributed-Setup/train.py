"""Non-Distributed-Setup: the digits classifier in one process, the baseline for every example.

What it teaches
    The learning problem every example in this guide shares, with nothing distributed about it:
    a tf.data pipeline of handwritten digits, a small MLP built from explicit variables, plain
    SGD, and a training loop in one tf.compat.v1.Session. ../Distributed-Setup/train.py is this
    file plus a cluster; read the two side by side to see exactly what distribution adds.

The update rule (each step)
    g      <- grad L(params; next mini-batch)
    params <- params - learning_rate * g

Run it
    bash run.sh                      # or: python train.py --steps 2000
    python train.py --data_path mnist.npz  # MNIST (or your own images) instead of the digits

Use your own model
    Edit the two sections marked "(replace with your own)": Data and Model.

References
    Y. LeCun, L. Bottou, Y. Bengio, P. Haffner, "Gradient-based learning applied to document
    recognition", Proc. IEEE 1998 (the MNIST digits).
"""
import argparse
import collections
import json
import os
import sys
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Non-Distributed-Setup"
JOBS = ()  # one process, no cluster; deploy/ and the tests read this here


def example_flags(parser):
    """This example has only the flags every example shares (see parse_flags)."""


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test pixel_max")


def load_dataset(data_path=""):
    """Flat integer pixels and integer labels, to train and to test: by default scikit-learn's
    1797 handwritten 8x8 digits (offline; a fixed fifth to test), or the arrays of mnist.npz."""
    if data_path:
        try:
            with np.load(data_path) as f:
                x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train",
                                                                   "x_test", "y_test"))
        except (OSError, KeyError, ValueError) as e:  # missing, unreadable, or a key missing
            fail("cannot load %s (%s): give an .npz with x_train, y_train, x_test and y_test"
                 % (data_path, str(e).splitlines()[0]))
    else:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        x, y = load_digits(return_X_y=True)
        x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                            stratify=y)
    flat = lambda x: x.reshape(len(x), -1).astype(np.uint8)
    return Dataset(flat(x_train), y_train.astype(np.int64), flat(x_test), y_test.astype(np.int64),
                   pixel_max=max(int(x_train.max()), 1))


def scale(pixels, pixel_max):
    return tf.cast(pixels, tf.float32) / float(pixel_max)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches: its own shard of the training set (no two
    workers share an example), reshuffled every epoch."""
    ds = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
    ds = ds.shard(num_workers, worker_index)
    ds = ds.shuffle(len(data.x_train) // num_workers + 1, seed=seed * 1000 + worker_index)
    ds = ds.repeat().batch(batch_size, drop_remainder=True)
    return ds.map(lambda x, y: (scale(x, data.pixel_max), y)).prefetch(2)

# <<< shared: data


# >>> shared: graph batches
def training_batches(data, batch_size, worker_index, num_workers, seed):
    """The next mini-batch of training_dataset, as tensors of the graph (no feed_dict)."""
    ds = training_dataset(data, batch_size, worker_index, num_workers, seed)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
# <<< shared: graph batches


# --- Model (replace with your own) ----------------------------------------------------------------
# >>> shared: model
def model_params(num_features, hidden, seed, num_classes=10):
    """The MLP's variables, created under the current device scope (the ps, in the examples)."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    return {"w1": tf.compat.v1.get_variable("w1", [num_features, hidden], initializer=glorot(1)),
            "b1": tf.compat.v1.get_variable("b1", [hidden], initializer=zeros),
            "w2": tf.compat.v1.get_variable("w2", [hidden, num_classes], initializer=glorot(2)),
            "b2": tf.compat.v1.get_variable("b2", [num_classes], initializer=zeros)}


def model_loss_and_accuracy(params, x, y):
    hidden = tf.nn.relu(tf.matmul(x, params["w1"]) + params["b1"])
    logits = tf.matmul(hidden, params["w2"]) + params["b2"]
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    return loss, accuracy
# <<< shared: model


# --- The algorithm --------------------------------------------------------------------------------
SGD = collections.namedtuple("SGD", "params global_step loss train_op")


def build_sgd(args, x, y):
    """Plain SGD: the variables live in this process and every step updates them."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    params = model_params(int(x.shape[1]), args.hidden, args.seed)
    loss = model_loss_and_accuracy(params, x, y)[0]
    train_op = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
        loss, global_step=global_step)
    return SGD(params, global_step, loss, train_op)


# --- The training loop ----------------------------------------------------------------------------
def train(args):
    data = load_dataset(args.data_path)
    sgd = build_sgd(args, *training_batches(data, args.batch_size, 0, 1, args.seed))
    x_test = scale(data.x_test, data.pixel_max)
    test_accuracy = model_loss_and_accuracy(sgd.params, x_test, data.y_test)[1]
    loss_value = tf.compat.v1.placeholder(tf.float32, [])
    summaries = tf.compat.v1.summary.merge([  # what TensorBoard shows
        tf.compat.v1.summary.scalar("test_accuracy", test_accuracy),
        tf.compat.v1.summary.scalar("loss", loss_value)])
    saver = tf.compat.v1.train.Saver()
    writer = tf.compat.v1.summary.FileWriter(args.log_dir, tf.compat.v1.get_default_graph())
    history, started = [], time.time()

    def evaluate(session, step, loss):  # the test accuracy, also to TensorBoard
        accuracy, summary = session.run([test_accuracy, summaries], {loss_value: loss})
        writer.add_summary(summary, step)
        history.append([round(time.time() - started, 3), step, float(accuracy)])
        return float(accuracy)

    print("[local] log_dir=%s" % args.log_dir, flush=True)
    with tf.compat.v1.Session() as session:
        checkpoint = tf.train.latest_checkpoint(args.log_dir)
        if checkpoint:
            saver.restore(session, checkpoint)
            print("[local] resuming from the checkpoint at global step %d"
                  % session.run(sgd.global_step), flush=True)
        else:
            session.run(tf.compat.v1.global_variables_initializer())
        start_step = int(session.run(sgd.global_step))
        print("[local] training started", flush=True)
        last_line_step, last_line_time, loss = start_step, time.time(), float("nan")
        for step in range(start_step + 1, args.steps + 1):
            _, loss = session.run([sgd.train_op, sgd.loss])
            if step % args.log_every == 0:
                rate = (step - last_line_step) / (time.time() - last_line_time)
                print("[local] local_step=%d global_step=%d loss=%.4f test_accuracy=%.4f "
                      "steps_per_sec=%.1f" % (step, step, loss, evaluate(session, step, loss),
                                              rate), flush=True)
                last_line_step, last_line_time = step, time.time()
        last_step = max(args.steps, start_step)
        saver.save(session, os.path.join(args.log_dir, "model.ckpt"), global_step=last_step)
        updates = last_step - start_step
        rate = updates / (time.time() - started)
        summary = dict(example=EXAMPLE, test_accuracy=evaluate(session, last_step, loss),
                       global_step=last_step, workers=1, ps=0, lost_workers=0,
                       local_steps=[updates], updates=updates, steps_per_sec=rate,
                       examples_per_sec=rate * args.batch_size, log_dir=args.log_dir)
    writer.close()
    print_summary("local", summary, history, args.metrics_file)
    return 0


def main(argv=None):
    global tf  # loaded only now: bad input has failed in one line, without TensorFlow's start-up
    args = parse_flags(argv, example_flags, distributed=False)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    return train(args)


# ==================================================================================================
# Plumbing shared by every example (you need not read below)
# ==================================================================================================
# What this one-process example shares with the others, in this order (a test keeps the copies
# equal):
#   1. flags                     parse_flags, fail
#   2. the summary line          print_summary
# >>> shared: flags
def fail(message):
    """One line on stderr and exit status 2: for bad input and lost peers, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def parse_flags(argv, example_flags, distributed=True):
    """The flags every example shares, then the example's own; bad values fail here."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: fail(message + " (see --help)")
    common = [
        ("steps", int, 2000, "mini-batches to train, summed over the workers"),
        ("batch_size", int, 64, "examples per mini-batch"),
        ("learning_rate", float, 0.1, "the workers' learning rate"),
        ("hidden", int, 128, "width of the MLP's hidden layer"),
        ("data_path", str, "", "your own images: an .npz like mnist.npz (default: digits)"),
        ("log_dir", str, "", "checkpoints and summaries; one that has them resumes"),
        ("seed", int, 0, "seed of the initial weights and the shuffling"),
        ("metrics_file", str, "", "also write the summary here, as JSON"),
        ("log_every", int, 100, "progress (the chief's: test accuracy) every N local steps"),
    ]
    cluster = [
        ("job_name", str, "", "ps or worker (or set TF_CONFIG)"),
        ("task_index", int, 0, "this task's index in its job"),
        ("ps_hosts", str, "", "comma-separated host:port of the ps tasks"),
        ("worker_hosts", str, "", "comma-separated host:port of the workers"),
        ("connect_timeout", float, None, "seconds to wait for the other tasks; if not given, "
         "60, or 600 under TF_CONFIG (a cluster's pods may start minutes apart)"),
    ]
    for flag, kind, default, text in common + (cluster if distributed else []):
        p.add_argument("--" + flag, type=kind, default=default, help=text)
    example_flags(p)
    args = p.parse_args(argv)
    for flag, value in vars(args).items():
        if type(value) not in (int, float):
            continue
        default = p.get_default(flag)
        counted = default is None or default >= 1  # a count, a size or a time (None: set later)
        if value < 0 or (value == 0 and counted):
            fail("--%s must be %s, got %s" % (flag, "positive" if counted else "0 or more", value))
    if not args.log_dir:  # a new folder for every run, beside this file
        run_name = time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
        args.log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", run_name)
    return args
# <<< shared: flags


# >>> shared: summary
def print_summary(role, summary, history, metrics_file):
    """The summary line, key=value ...; with --metrics_file also as JSON, with the history of the
    test accuracy ([seconds, global step, accuracy] per evaluation)."""
    def text(value):
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return "%.6g" % value
        return str(value)
    fields = " ".join("%s=%s" % (key, text(value)) for key, value in summary.items())
    print("[%s] summary %s" % (role, fields), flush=True)
    if metrics_file:
        with open(metrics_file, "w") as f:
            json.dump(dict(summary, history=history), f, indent=1)
# <<< shared: summary


if __name__ == "__main__":
    sys.exit(main())
