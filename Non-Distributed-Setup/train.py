"""Non-Distributed-Setup: the digits classifier in one process, the baseline for every example.

What it teaches
    The learning problem every example in this guide shares, with nothing distributed about it:
    a tf.data pipeline of handwritten digits, a small MLP built from explicit variables, plain
    SGD, and a training loop in one tf.compat.v1.Session. ../Distributed-Setup/train.py is this
    file plus a cluster; read the two side by side to see exactly what distribution adds.

The update rule (each step)
    g     <- grad L(theta; next mini-batch)
    theta <- theta - learning_rate * g

Run it
    bash run.sh                      # or: python train.py --steps 2000
    python train.py --dataset mnist  # MNIST instead of the bundled digits (downloads once)

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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: hide TensorFlow's C++ info
import numpy as np
import tensorflow as tf

EXAMPLE = "Non-Distributed-Setup"


# ==================================================================================================
# Flags
# ==================================================================================================
# >>> shared: flags
class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        fail(message + " (see --help)")


def fail(message):
    """Stop with one line on stderr and exit status 2: for bad input, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def common_flags(description):
    """The flags every example shares; an example adds its own to the parser this returns."""
    p = OneLineErrorParser(description=description,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=2000,
                   help="mini-batch steps to train, summed over all workers")
    p.add_argument("--batch_size", type=int, default=64, help="examples per mini-batch")
    p.add_argument("--learning_rate", type=float, default=0.1,
                   help="learning rate of the workers' optimizer")
    p.add_argument("--hidden", type=int, default=128, help="width of the MLP's hidden layer")
    p.add_argument("--dataset", default="digits", help="digits (bundled, offline) or mnist")
    p.add_argument("--data_path", default="", help="a local mnist.npz (else mnist downloads)")
    p.add_argument("--log_dir", default="",
                   help="checkpoints and TensorBoard summaries; an existing one resumes "
                        "(default: a new logs/<time> folder beside train.py)")
    p.add_argument("--seed", type=int, default=0, help="seed of initial weights and shuffling")
    p.add_argument("--metrics_file", default="", help="also write the summary here, as JSON")
    p.add_argument("--log_every", type=int, default=100, help="progress every N local steps")
    p.add_argument("--eval_every", type=int, default=200,
                   help="test accuracy every N local steps of the chief (0: at the end only)")
    return p


def check_common_flags(args):
    """Reject bad values before any server starts, so every task fails alike and at once."""
    for name in ("steps", "batch_size", "learning_rate", "hidden", "log_every"):
        if getattr(args, name) <= 0:
            fail("--%s must be positive, got %s" % (name, getattr(args, name)))
    if args.eval_every < 0:
        fail("--eval_every must be 0 (only at the end) or positive, got %d" % args.eval_every)
    if args.dataset not in ("digits", "mnist"):
        fail("unknown dataset %r: use digits or mnist" % args.dataset)
# <<< shared: flags


# ==================================================================================================
# Data (replace with your own)
# ==================================================================================================
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test pixel_max")


def load_dataset(name, data_path=""):
    """Handwritten digits as integer pixels and labels, with a fixed train/test split.

    digits: scikit-learn's bundled 8x8 images (1797), offline; a fixed 20% is the test set.
    mnist:  28x28 images (70000) from a local .npz (keys x_train, y_train, x_test, y_test),
            or downloaded once by tf.keras.datasets into ~/.keras/datasets.
    """
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(
            digits.data.astype(np.uint8), digits.target.astype(np.int64),
            test_size=0.2, random_state=0, stratify=digits.target)
        return Dataset(x_train, y_train, x_test, y_test, pixel_max=16)
    if name == "mnist":
        try:
            if data_path:
                with np.load(data_path) as f:
                    x_train, y_train, x_test, y_test = (
                        f["x_train"], f["y_train"], f["x_test"], f["y_test"])
            else:
                (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
        except Exception as e:  # a missing file or no network: say which, in one line
            fail("could not load MNIST (%s: %s); pass --data_path to a local mnist.npz"
                 % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        flat = lambda x: x.reshape(len(x), -1).astype(np.uint8)
        return Dataset(flat(x_train), y_train.astype(np.int64), flat(x_test),
                       y_test.astype(np.int64), pixel_max=255)
    fail("unknown dataset %r: use digits or mnist" % name)


def scale(pixels, pixel_max):
    return tf.cast(pixels, tf.float32) / float(pixel_max)


def training_batches(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches, built in the graph (no feed_dict).

    Each worker takes its own shard of the training set, so no two workers train on the same
    example, and reshuffles it every epoch, so every step sees a new batch.
    """
    ds = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
    ds = ds.shard(num_workers, worker_index)
    ds = ds.shuffle(len(data.x_train) // num_workers + 1, seed=seed * 1000 + worker_index,
                    reshuffle_each_iteration=True)
    ds = ds.repeat().batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda x, y: (scale(x, data.pixel_max), y)).prefetch(2)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
# <<< shared: data


# ==================================================================================================
# Model (replace with your own)
# ==================================================================================================
# >>> shared: model
def model_params(num_features, hidden, seed, num_classes=10):
    """The MLP's variables, created under the current device scope (the ps, in the examples)."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    return collections.OrderedDict([
        ("w1", tf.compat.v1.get_variable("w1", [num_features, hidden], initializer=glorot(1))),
        ("b1", tf.compat.v1.get_variable("b1", [hidden], initializer=zeros)),
        ("w2", tf.compat.v1.get_variable("w2", [hidden, num_classes], initializer=glorot(2))),
        ("b2", tf.compat.v1.get_variable("b2", [num_classes], initializer=zeros)),
    ])


def model_loss_and_accuracy(params, x, y):
    hidden = tf.nn.relu(tf.matmul(x, params["w1"]) + params["b1"])
    logits = tf.matmul(hidden, params["w2"]) + params["b2"]
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    return loss, accuracy
# <<< shared: model


# ==================================================================================================
# The algorithm
# ==================================================================================================
def build_training_graph(args, data):
    """Plain SGD: the variables live in this process and every step updates them."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    params = model_params(data.x_train.shape[1], args.hidden, args.seed)
    x, y = training_batches(data, args.batch_size, 0, 1, args.seed)
    loss, accuracy = model_loss_and_accuracy(params, x, y)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
        loss, global_step=global_step)
    test_accuracy = model_loss_and_accuracy(
        params, scale(data.x_test, data.pixel_max), data.y_test)[1]
    tf.compat.v1.summary.scalar("loss", loss)
    tf.compat.v1.summary.scalar("train_accuracy", accuracy)
    return global_step, train_op, loss, test_accuracy


# ==================================================================================================
# Training loop
# ==================================================================================================
def train(args):
    role = "local"
    data = load_dataset(args.dataset, args.data_path)
    global_step, train_op, loss, test_accuracy = build_training_graph(args, data)
    summaries = tf.compat.v1.summary.merge_all()
    saver = tf.compat.v1.train.Saver()

    start_step, history = 0, []
    print("[%s] log_dir=%s" % (role, args.log_dir), flush=True)
    writer = tf.compat.v1.summary.FileWriter(args.log_dir, tf.compat.v1.get_default_graph())

    def record_test_accuracy(session, step, elapsed):
        accuracy = session.run(test_accuracy)
        history.append([round(elapsed, 3), int(step), float(accuracy)])
        writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
            tag="test_accuracy", simple_value=accuracy)]), step)
        return float(accuracy)

    local_step, started = 0, time.time()
    with tf.compat.v1.Session() as sess:
        checkpoint = tf.train.latest_checkpoint(args.log_dir)
        if checkpoint:
            saver.restore(sess, checkpoint)
            start_step = int(sess.run(global_step))
            print("[%s] resuming from the checkpoint at global step %d" % (role, start_step))
        else:
            sess.run(tf.compat.v1.global_variables_initializer())
        print("[%s] training started" % role, flush=True)
        sess.run(train_op)  # the first step also sets the graph up: untimed, as in the others
        local_step = 1
        train_started = last_time = time.time()
        while start_step + local_step < args.steps:
            local_step += 1
            step = start_step + local_step
            log_now = local_step % args.log_every == 0
            eval_now = args.eval_every and local_step % args.eval_every == 0
            if not (log_now or eval_now):
                sess.run(train_op)
                continue
            _, loss_value = sess.run([train_op, loss])
            if log_now:
                now = time.time()
                progress(role, local_step, step, loss_value, args.log_every / (now - last_time))
                last_time = now
                writer.add_summary(sess.run(summaries), step)
            if eval_now:
                record_test_accuracy(sess, step, time.time() - started)
        train_seconds = time.time() - train_started
        step = start_step + local_step
        saver.save(sess, os.path.join(args.log_dir, "model.ckpt"), global_step=step)
        final_step = int(sess.run(global_step))
        final_accuracy = record_test_accuracy(sess, final_step, time.time() - started)
    writer.close()
    steps_done = final_step - start_step - 1  # the timed steps: all but the first
    report(role, args.metrics_file, collections.OrderedDict([
        ("example", EXAMPLE), ("test_accuracy", final_accuracy), ("global_step", final_step),
        ("workers", 1), ("ps", 0), ("local_steps", [local_step]), ("lost_workers", 0),
        ("wall_seconds", time.time() - started),
        ("steps_per_sec", steps_done / max(train_seconds, 1e-9)),
        ("examples_per_sec", steps_done * args.batch_size / max(train_seconds, 1e-9)),
        ("batch_size", args.batch_size), ("log_dir", args.log_dir), ("history", history)]))
    return 0


# >>> shared: reporting
def default_log_dir():
    stamp = time.strftime("%Y%m%d-%H%M%S") + "-%d" % os.getpid()
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", stamp)


def progress(role, local_step, global_step, loss, steps_per_sec):
    print("[%s] local_step=%d global_step=%d loss=%.4f steps_per_sec=%.1f"
          % (role, local_step, global_step, loss, steps_per_sec), flush=True)


def report(role, metrics_file, metrics):
    """The one summary line, in stable key=value pairs, and the same as JSON if asked."""
    def text(value):
        if isinstance(value, float):
            return "%.6g" % value
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)
    print("[%s] summary %s" % (role, " ".join(
        "%s=%s" % (k, text(v)) for k, v in metrics.items() if k != "history")), flush=True)
    if metrics_file:
        with open(metrics_file, "w") as f:
            json.dump(metrics, f, indent=1)
# <<< shared: reporting


# ==================================================================================================
# main
# ==================================================================================================
def main(argv=None):
    args = common_flags(__doc__.splitlines()[0]).parse_args(argv)
    check_common_flags(args)
    args.log_dir = args.log_dir or default_log_dir()
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
