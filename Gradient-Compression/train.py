"""Gradient-Compression: synchronous SGD whose messages are compressed both ways (top-k with error
feedback, random-k, QSGD, signSGD, PowerSGD).

What it teaches
    Sync-SGD's step with small messages. A worker adds what its earlier messages missed (its
    residual) to its update, pushes a compressed message of it to the ps and keeps what this one
    misses; the ps decodes the N messages, sums them, divides by N, compresses the mean again
    and sends that back; every worker decodes it and moves its own copy of the parameters, so
    no dense tensor crosses the network but a resynchronisation every --resync steps. One ps:
    the messages meet there, and it applies each step to the parameters it holds.

The update rule (step t, N workers, C a compressor, lr_eff = N * learning_rate as in Sync-SGD)
    worker k:  p_k <- lr_eff * grad L(local_params_k; next mini-batch of k) + e_k
               push m_k = C(p_k);   e_k <- p_k - decode(m_k)                 (error feedback)
    the ps:    u <- (1/N) sum_k decode(m_k) + e_ps
               reply r = C(u);   e_ps <- u - decode(r);   global_params -= decode(r)
    worker k:  pull r;   local_params_k -= decode(r)            (every copy takes the same step)
               every --resync steps: local_params_k <- global_params         (a dense pull)
    random-k draws the same coordinates on every worker and QSGD rounds at random: both are
    unbiased and run without error feedback (e = 0). Random-k and PowerSGD are linear, so the
    reply is the mean of the messages, exact. PowerSGD, per matrix M_k = p_k (Q kept from the
    last step): push P_k = M_k Q; pull P = orthonormal(mean P_k); push Q_k = M_k^T P; pull
    Q = mean Q_k; C(p_k) = P Q_k^T, the reply's decode P Q^T; vectors go dense.

Run it
    bash run.sh                                        # top-k 1%, error feedback, 1 ps + 2 workers
    bash run.sh --compressor topk --no-error_feedback  # watch top-k degrade without it
    bash run.sh --compressor powersgd --rank 2         # by hand, TF_CONFIG: ../Distributed-Setup

Use your own model: edit the sections marked "(replace with your own)", Data and Model.

References
    Y. Lin et al., "Deep Gradient Compression", ICLR 2018. S. U. Stich, J.-B. Cordonnier,
    M. Jaggi, "Sparsified SGD with Memory", NeurIPS 2018. D. Alistarh et al., "QSGD", NeurIPS
    2017. J. Bernstein et al., "signSGD with Majority Vote", ICLR 2019. S. P. Karimireddy et al.,
    "Error Feedback Fixes SignSGD", ICML 2019. T. Vogels, S. P. Karimireddy, M. Jaggi, "PowerSGD",
    NeurIPS 2019. H. Tang et al., "DoubleSqueeze" (compressing both ways), ICML 2019.
"""
import argparse
import collections
import contextlib
import glob
import json
import math
import os
import socket
import sys
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Gradient-Compression"
JOBS = ("ps", "worker")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    parser.add_argument("--compressor", default="topk", choices=sorted(COMPRESSORS))
    parser.add_argument("--ratio", type=positive_float, default=0.01,
                        help="topk, randk: the fraction of each tensor's entries sent")
    parser.add_argument("--topk_method", default="sampled", choices=["sampled", "exact"],
                        help="topk: top_k over the entries above a threshold from a 1%% sample "
                             "(the same k at less cost; the default) or over every entry")
    parser.add_argument("--levels", type=positive_int, default=127, help="qsgd: s, at most 127")
    parser.add_argument("--rank", type=positive_int, default=2, help="powersgd: r")
    parser.add_argument("--error_feedback", action=argparse.BooleanOptionalAction, default=True,
                        help="keep what a message missed and send it later (biased compressors)")
    parser.add_argument("--resync", type=positive_int, default=500,
                        help="every N steps each worker copies the ps's parameters (dense)")
    parser.add_argument("--step_timeout", type=positive_float, default=30,
                        help="seconds a step may wait for the other workers before failing")


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test num_classes x_scale",
                                 defaults=[1.0])  # x_scale: integer pixels are divided by it


def load_dataset(data_path=""):
    """By default scikit-learn's 1797 handwritten 8x8 digits (offline; a fixed fifth to test),
    rows of 64 pixels in [0, 1], labels 0-9; or data_path's, checked below the banner."""
    if data_path.endswith(".npz"):  # arrays (read_npz)
        return Dataset(*read_npz(data_path))
    if data_path:  # a folder of TFRecord files (read_records)
        return read_records(data_path)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    return Dataset((x_train / 16).astype(np.float32), y_train.astype(np.int64),
                   (x_test / 16).astype(np.float32), y_test.astype(np.int64), num_classes=10)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches: its own shard, reshuffled every epoch."""
    if isinstance(data, Records):  # files: this worker reads files of its own
        return records_dataset(data, batch_size, worker_index, num_workers, seed)
    ds = arrays_dataset(data.x_train, data.y_train, worker_index, num_workers, seed, data.x_scale)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)
# <<< shared: data


# >>> shared: graph batches
def training_batches(data, batch_size, worker_index, num_workers, seed):
    """The next mini-batch of training_dataset, tensors of the graph: see session_stream."""
    return session_stream(lambda session_seed: training_dataset(
        data, batch_size, worker_index, num_workers, session_seed), seed, worker_index)
# <<< shared: graph batches


# --- Model (replace with your own) ----------------------------------------------------------------
# >>> shared: model
def model_params(input_shape, hidden, seed, num_classes=10):
    """The MLP's variables, made under the current device scope (the ps, in the examples), for
    examples of input_shape (a row of features, or an image that the MLP reads as one row)."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    features = int(np.prod(input_shape))
    return {"w1": tf.compat.v1.get_variable("w1", [features, hidden], initializer=glorot(1)),
            "b1": tf.compat.v1.get_variable("b1", [hidden], initializer=zeros),
            "w2": tf.compat.v1.get_variable("w2", [hidden, num_classes], initializer=glorot(2)),
            "b2": tf.compat.v1.get_variable("b2", [num_classes], initializer=zeros)}


def model_logits(params, x):
    rows = tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])  # an image becomes one row
    hidden = tf.nn.relu(tf.matmul(rows, params["w1"]) + params["b1"])
    return tf.matmul(hidden, params["w2"]) + params["b2"]


def model_loss(params, x, y):
    """What training minimises: the mean cross-entropy over a mini-batch."""
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=model_logits(params, x)))


def model_metrics(params, x, y):
    """What the chief reports on the test set, by name: each a mean over a batch of examples."""
    correct = tf.equal(tf.argmax(model_logits(params, x), 1), y)
    return {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}
# <<< shared: model


# --- The algorithm --------------------------------------------------------------------------------
PS = "/job:ps/task:0"  # where the messages meet: the queues and the ps's residual


def build_gradient_compression(args, task_index, workers, global_params, loss_of):
    """This worker's ops. step: one synchronous step (its value: the loss and the new global
    step); the chief's step also makes the reply, on the ps. resync: local_params <-
    global_params. loss_of(params) is the model's loss on this worker's next mini-batch."""
    compressor = COMPRESSORS[args.compressor](args)
    error_feedback = args.error_feedback and compressor.biased  # unbiased ones keep none
    with tf.compat.v1.device(PS):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        first_seed = global_step.read_value() * len(global_params)  # a seed per step and tensor
        ps_residuals = {n: tf.compat.v1.Variable(tf.zeros(v.shape), trainable=False,
                                                 name="ps_residual_" + n)
                        for n, v in global_params.items()}
    with tf.compat.v1.device("/job:worker/task:%d" % task_index):
        local_params = worker_variables("local", global_params, lambda v: v.read_value())
        residuals = worker_variables("residual", global_params, lambda v: tf.zeros(v.shape))
        loss = loss_of(local_params)
        gradients = tf.gradients(loss, list(local_params.values()))
        learning_rate = args.learning_rate * workers  # the linear scaling rule, as in Sync-SGD
        p = {n: learning_rate * g + residuals[n] for n, g in zip(local_params, gradients)}
        seeds = random_seeds(args.seed, first_seed, sorted(p))
        wire = Wire(task_index, workers, seeds, error_feedback, ps_residuals,
                    lambda update, reply: apply_on_ps(global_params, global_step, update, reply))
        round_trips = powersgd_round_trips if args.compressor == "powersgd" else one_round_trip
        sent, update, push_bytes, pull_bytes = round_trips(compressor, p, wire)
        kept = []
        if error_feedback:  # keep what the message missed, to send it later
            kept = [residuals[n].assign(p[n] - sent[n], read_value=False) for n in p]
        with tf.control_dependencies(kept + [local_params[n].assign_sub(update[n], read_value=False)
                                             for n in update]):
            step = tf.identity(loss), global_step.read_value()  # t + 1: the reply was applied
        resync = tf.group([local_params[n].assign(v.read_value(), read_value=False)
                           for n, v in global_params.items()])
    return GradientCompression(global_params, local_params, global_step, loss, step, resync,
                               update, residuals, ps_residuals, p, sent, error_feedback,
                               push_bytes, pull_bytes)


# This worker's ops and tensors, as build_gradient_compression returns them
GradientCompression = collections.namedtuple("GradientCompression", (
    "global_params local_params global_step loss step resync update residuals ps_residuals "
    "p sent error_feedback push_bytes pull_bytes"))


# What the round trips share: this worker's place, the step's random seeds, and what the ps
# keeps and does once a step's reply is made (apply_on_ps(update, reply) -> the reply, after).
Wire = collections.namedtuple("Wire", "task_index workers seeds error_feedback ps_residuals "
                                      "apply_on_ps")


def one_round_trip(compressor, p, wire):
    """Push C(p), pull the reply. Returns (sent: decode of this worker's message, update: decode
    of the reply, the bytes pushed, the bytes pulled)."""
    shapes = {n: x.shape for n, x in p.items()}
    shared = wire.seeds(0)  # the same on every task: random-k's coordinates, and decoding
    own = wire.seeds(1 + wire.task_index) if compressor.own_draws else shared
    message = {n: compressor.encode(x, own[n]) for n, x in p.items()}
    sent = {n: compressor.decode(m, shapes[n], shared[n]) for n, m in message.items()}

    def reply_to(messages):  # on the ps: the N messages of one step, one reply
        if compressor.linear:  # the mean of the messages is the message of the mean
            reply = mean_of(messages, wire.workers)
        else:  # decode, sum, divide by N and compress again, with the ps's own residual
            ps_own = wire.seeds(1 + wire.workers) if compressor.own_draws else shared
            reply = {}
            for n, shape in shapes.items():
                u = tf.add_n([compressor.decode(m[n], shape, shared[n])
                              for m in messages]) / wire.workers
                if wire.error_feedback:
                    u += wire.ps_residuals[n]
                reply[n] = compressor.encode(u, ps_own[n])
                if wire.error_feedback:  # e_ps <- u - decode(r), before anyone pulls r
                    keep = wire.ps_residuals[n].assign(u - compressor.decode(
                        reply[n], shape, shared[n]), read_value=False)
                    reply[n] = with_dependencies([keep], reply[n])
        update = {n: compressor.decode(r, shapes[n], shared[n]) for n, r in reply.items()}
        return wire.apply_on_ps(update, reply)

    reply = exchange("gc", message, reply_to, wire)
    update = {n: compressor.decode(r, shapes[n], shared[n]) for n, r in reply.items()}
    return sent, update, message_bytes(message), message_bytes(reply)


def powersgd_round_trips(compressor, p, wire):
    """PowerSGD (Vogels et al. 2019, Algorithm 1): per matrix two round trips, P then Q, with Q
    kept from step to step on every worker (the same on all); vectors and small matrices go
    dense in the first. Returns what one_round_trip does."""
    low_rank = [n for n, x in p.items() if compressor.compresses(x.shape)]
    if not low_rank:
        fail("--rank %d: no matrix of the model is large enough for PowerSGD" % compressor.rank)
    q_kept = worker_variables("powersgd_q", {n: tf.random.stateless_normal(
        [p[n].shape[1], compressor.rank], [compressor.args.seed, i])
        for i, n in enumerate(low_rank)}, lambda q: q)  # the same start on every worker
    on_ps = {}  # what the first reply made on the ps (each P, the dense means): the second's

    def reply_p(messages):  # on the ps: P = orthonormal(mean P_k); the dense tensors' mean
        for n, (mean,) in mean_of(messages, wire.workers).items():
            on_ps[n] = tf.linalg.qr(mean)[0] if n in low_rank else mean
        return {n: (x,) for n, x in on_ps.items()}

    def reply_q(messages):  # on the ps: Q = mean Q_k; the step's update is P Q^T
        q_mean = {n: q for n, (q,) in mean_of(messages, wire.workers).items()}
        update = {n: tf.matmul(on_ps[n], q_mean[n], transpose_b=True) if n in low_rank
                  else on_ps[n] for n in p}
        return wire.apply_on_ps(update, {n: (q,) for n, q in q_mean.items()})

    message_p = {n: (tf.matmul(p[n], q_kept[n]) if n in low_rank else p[n],) for n in p}
    pulled_p = {n: x for n, (x,) in exchange("powersgd_p", message_p, reply_p, wire).items()}
    q_mine = {n: tf.matmul(p[n], pulled_p[n], transpose_a=True) for n in low_rank}
    message_q = {n: (q,) for n, q in q_mine.items()}
    pulled_q = {n: q for n, (q,) in exchange("powersgd_q", message_q, reply_q, wire).items()}
    sent, update = dict(p), dict(pulled_p)  # the dense tensors: sent whole, their mean back
    for n in low_rank:
        sent[n] = tf.matmul(pulled_p[n], q_mine[n], transpose_b=True)  # P P^T p_k
        update[n] = tf.matmul(pulled_p[n], pulled_q[n], transpose_b=True)
    with tf.control_dependencies([q_kept[n].assign(pulled_q[n], read_value=False)
                                  for n in low_rank]):  # the next step starts from this Q
        update = {n: tf.identity(u) for n, u in update.items()}
    both_ways = message_bytes(message_p) + message_bytes(message_q)
    return sent, update, both_ways, both_ways


def mean_of(messages, workers):
    """The part-by-part mean of N messages of the same form, on the ps."""
    return {n: tuple(tf.add_n(list(parts)) / workers for parts in zip(*[m[n] for m in messages]))
            for n in messages[0]}


def exchange(name, message, reply_to, wire):
    """One round trip through the ps. Each worker pushes its message into the ps's inbox; the
    chief's step takes the N messages off it, makes them one reply there (reply_to) and puts a
    copy in every worker's outbox; each worker pulls its own. The queues hold the messages
    themselves: what crosses the network is the message, each way. A worker cannot push twice
    before it has pulled, so the N messages taken are one from each worker, of the same step."""
    flat = tf.nest.flatten(message)
    kinds, shapes = [t.dtype for t in flat], [t.shape for t in flat]
    with tf.compat.v1.device(PS):
        queue = lambda box, size: tf.queue.FIFOQueue(size, kinds, shapes, shared_name=box,
                                                     name=box)
        inbox = queue(name + "_inbox", wire.workers)
        outboxes = [queue("%s_outbox%d" % (name, k), 1) for k in range(wire.workers)]
        push = inbox.enqueue(flat)
        after = [push]
        if wire.task_index == 0:  # the chief makes the reply, on the ps
            with tf.control_dependencies([push]):
                received = tf.nest.flatten(inbox.dequeue_many(wire.workers))  # a list, even of 1
            messages = [tf.nest.pack_sequence_as(message, [part[k] for part in received])
                        for k in range(wire.workers)]
            reply = tf.nest.flatten(reply_to(messages))
            after.append(tf.group([box.enqueue(reply) for box in outboxes]))
        with tf.control_dependencies(after):
            pulled = tf.nest.flatten(outboxes[wire.task_index].dequeue())
            return tf.nest.pack_sequence_as(message, pulled)


def apply_on_ps(global_params, global_step, update, reply):
    """The ps's own copy takes the step every worker takes, and the step is counted, before
    any worker can pull the reply. Returns the reply."""
    applied = [global_params[n].assign_sub(u, read_value=False) for n, u in update.items()]
    with tf.control_dependencies(applied):  # not before: a worker reads t to seed its step
        counted = global_step.assign_add(1, read_value=False)
    with tf.control_dependencies([counted]):
        return tf.nest.map_structure(tf.identity, reply)


def with_dependencies(dependencies, tensors):
    with tf.control_dependencies(dependencies):
        return tuple(tf.identity(t) for t in tensors)


def random_seeds(seed, first_seed, names):
    """seeds(who) -> a seed per tensor for this step's random draws: who = 0 the same on every
    task, who = 1 + k worker k's own, 1 + N the ps's."""
    return lambda who: {n: tf.stack([tf.constant(seed * 1000 + who, tf.int64), first_seed + i])
                        for i, n in enumerate(names)}


def message_bytes(message):
    """The bytes of a message's tensors: what it costs on the wire, before gRPC's framing."""
    return sum(t.shape.num_elements() * t.dtype.size for t in tf.nest.flatten(message))


# --- The compressors: encode(x, seed) -> message (a tuple of tensors); decode(message) -> x -------
class Compressor(object):
    """biased: E[decode(encode(x))] != x, so error feedback applies; linear: the mean of N
    messages is the message of the mean (the ps replies with it, exactly); own_draws: each
    worker draws its own random numbers (the others' draws are shared by every task)."""
    biased, linear, own_draws = True, False, False

    def __init__(self, args):
        self.args = args


def kept(ratio, d):
    """k = ratio * d entries of a tensor of d, at least 1."""
    return max(1, min(d, int(round(ratio * d))))


class NoCompression(Compressor):
    """Dense fp32, as Sync-SGD sends: 4d bytes."""
    biased, linear = False, True

    def encode(self, x, seed):
        return (x,)

    def decode(self, message, shape, seed):
        return message[0]


class HalfPrecision(Compressor):
    """Dense fp16: 2d bytes; rounding drops the low bits (biased, a little)."""

    def encode(self, x, seed):
        return (tf.cast(x, tf.float16),)

    def decode(self, message, shape, seed):
        return tf.cast(message[0], tf.float32)


class TopK(Compressor):
    """The k = ratio * d entries of largest magnitude: fp32 values and int32 flat indices, 8k
    bytes (Lin et al. 2018; Stich et al. 2018). --topk_method exact runs top_k over all d
    entries, the costly part of a step on a small CPU. sampled (the default) finds the same k
    with less work, as Lin et al. 2018 do: a threshold estimated from a random sample of the
    entries lets about 2k of them through, and top_k runs over those only (largest_above); a
    small tensor takes the exact way, cheap there."""
    SAMPLED_FROM = 2 ** 15  # entries: a smaller tensor takes top_k over all of them
    SAMPLE = 0.01  # the fraction of the entries sampled, at least 1024 of them
    MARGIN = 2  # the threshold lets about MARGIN * k entries through: fewer than k only rarely

    def encode(self, x, seed):
        flat = tf.reshape(x, [-1])
        magnitudes, d = tf.abs(flat), flat.shape[0]
        k = kept(self.args.ratio, d)
        if self.args.topk_method == "sampled" and d >= self.SAMPLED_FROM:
            indices = largest_above(self.sampled_threshold(magnitudes, k, seed), magnitudes, k)
        else:
            indices = tf.math.top_k(magnitudes, k).indices
        return tf.gather(flat, indices), indices

    def sampled_threshold(self, magnitudes, k, seed):
        """A magnitude that about MARGIN * k of the d entries reach: the sample's entry with
        MARGIN * k / d of the sample at or above it."""
        d = magnitudes.shape[0]
        size = max(1024, math.ceil(self.SAMPLE * d))
        drawn = tf.random.stateless_uniform([size], seed, minval=0, maxval=d, dtype=tf.int32)
        rank = min(size, math.ceil(self.MARGIN * k * size / d))
        return tf.math.top_k(tf.gather(magnitudes, drawn), rank).values[-1]

    def decode(self, message, shape, seed):
        values, indices = message
        return tf.reshape(tf.scatter_nd(indices[:, None], values, [shape.num_elements()]), shape)


def largest_above(threshold, magnitudes, k):
    """The indices of the k largest magnitudes, in tf.math.top_k's order. When k or more
    entries reach the threshold, the k largest are all among them, and top_k runs over those
    candidates alone (kept in index order, so that ties fall as over all d); else over all d."""
    candidates = tf.cast(tf.where(magnitudes >= threshold)[:, 0], tf.int32)
    among_candidates = lambda: tf.gather(
        candidates, tf.math.top_k(tf.gather(magnitudes, candidates), k).indices)
    return tf.cond(tf.size(candidates) >= k, among_candidates,
                   lambda: tf.math.top_k(magnitudes, k).indices)


class RandomK(Compressor):
    """k = ratio * d entries drawn at random from a seed every task shares, so the values alone
    go (4k bytes), times d / k: unbiased. Linear: all workers send the same coordinates."""
    biased, linear = False, True

    def chosen(self, d, seed):
        noise = tf.random.stateless_uniform([d], seed)
        return tf.math.top_k(noise, kept(self.args.ratio, d)).indices

    def encode(self, x, seed):
        flat = tf.reshape(x, [-1])
        return (tf.gather(flat, self.chosen(flat.shape[0], seed)),)

    def decode(self, message, shape, seed):
        d = shape.num_elements()
        scaled = message[0] * (d / kept(self.args.ratio, d))
        return tf.reshape(tf.scatter_nd(self.chosen(d, seed)[:, None], scaled, [d]), shape)


class QSGD(Compressor):
    """Each entry to one of s levels of the tensor's norm, rounded up or down at random so that
    the expectation is exact (Alistarh et al. 2017): int8 levels with their signs and the fp32
    norm, d + 4 bytes."""
    biased, own_draws = False, True

    def encode(self, x, seed):
        norm = tf.norm(x)
        scaled = tf.math.divide_no_nan(tf.abs(x), norm) * self.args.levels  # in [0, s]
        lower = tf.floor(scaled)
        up = tf.random.stateless_uniform(x.shape, seed) < scaled - lower  # p = distance to lower
        levels = tf.sign(x) * (lower + tf.cast(up, tf.float32))
        return tf.cast(levels, tf.int8), norm

    def decode(self, message, shape, seed):
        levels, norm = message
        return norm * tf.cast(levels, tf.float32) / self.args.levels


class Sign(Compressor):
    """Each entry's sign, +, - or 0, five to a byte (3^5 = 243 values fit in 256), and one
    scale, the mean magnitude (the l1 norm / d, as EF-signSGD): d/5 + 4 bytes. Zero is sent
    as zero: an entry whose update is always 0 never moves. The ps's reply is the sign of the
    workers' scaled sum, a vote weighted by each worker's scale (Bernstein et al. 2019;
    Karimireddy et al. 2019)."""
    DIGITS = [81, 27, 9, 3, 1]  # a byte holds five base-3 digits, sign + 1 in {0, 1, 2}

    def encode(self, x, seed):
        flat = tf.reshape(x, [-1])
        d = flat.shape[0]
        digits = tf.pad(tf.cast(tf.sign(flat), tf.int32) + 1, [[0, 5 * math.ceil(d / 5) - d]],
                        constant_values=1)  # the padding, zeros
        packed = tf.reduce_sum(tf.reshape(digits, [-1, 5]) * self.DIGITS, axis=1)
        return tf.cast(packed, tf.uint8), tf.reduce_mean(tf.abs(flat))

    def decode(self, message, shape, seed):
        packed, scale = message
        digits = tf.math.floormod(tf.cast(packed, tf.int32)[:, None] // self.DIGITS, 3)
        signs = tf.cast(tf.reshape(digits, [-1])[:shape.num_elements()] - 1, tf.float32)
        return scale * tf.reshape(signs, shape)


class PowerSGD(Compressor):
    """Rank r per matrix: P (m x r) and Q (n x r), 4r(m + n) bytes each way, in two round trips
    (powersgd_round_trips); a matrix for which that is no saving, and every vector, goes dense."""

    def __init__(self, args):
        super(PowerSGD, self).__init__(args)
        self.rank = args.rank

    def compresses(self, shape):
        return shape.rank == 2 and self.rank * (shape[0] + shape[1]) < shape[0] * shape[1]


COMPRESSORS = {"none": NoCompression, "fp16": HalfPrecision, "topk": TopK, "randk": RandomK,
               "qsgd": QSGD, "sign": Sign, "powersgd": PowerSGD}


# >>> shared: worker variables
def worker_variables(prefix, like, initial_value):
    """One variable on this worker per parameter in like, named prefix_<name>. LOCAL_VARIABLES:
    each worker initialises its own, and checkpoints leave them out."""
    return {n: tf.compat.v1.Variable(initial_value(p), trainable=False, name=prefix + "_" + n,
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            for n, p in like.items()}
# <<< shared: worker variables


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, server, data):
    workers = len(cluster["worker"])
    x, y = training_batches(data, args.batch_size, args.task_index, workers,
                            args.seed)  # no device given: the pipeline runs on this worker
    # placement: every variable made in this scope goes to a ps task (in turn), every other op
    # to this worker
    on_the_ps = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device="/job:worker/task:%d" % args.task_index)
    with tf.compat.v1.device(on_the_ps):
        global_params = model_params(x.shape[1:], args.hidden, args.seed, data.num_classes)
    loss_of = lambda params: model_loss(params, x, y)
    gc = build_gradient_compression(args, args.task_index, workers, global_params, loss_of)
    dense_bytes = sum(v.shape.num_elements() * 4 for v in global_params.values())  # fp32
    # rejoins=False: a restarted worker's copy and residual are not the others', and the ps's
    # accumulators may hold half a step: a restart ends the run in one line instead
    worker = Worker(args, cluster, lambda x, y: model_metrics(gc.global_params, x, y),
                    data, rejoins=False)
    loss, step = gc.step  # a step's values: its loss, and the global step after it
    with worker.session(server, loss, step, wait_for_everyone=True,  # each step needs everyone
                        last_step=math.ceil(args.steps / workers),  # --steps counts mini-batches
                        minibatches_per_update=workers, compressor=args.compressor,
                        error_feedback=gc.error_feedback, push_bytes=gc.push_bytes,
                        pull_bytes=gc.pull_bytes, dense_bytes=dense_bytes,
                        resync=args.resync) as session:
        while not session.should_stop():
            _, global_step = sync_round(session, gc.step, args, "synchronous step")
            if global_step % args.resync == 0 and not session.should_stop():
                session.run(gc.resync)  # a dense pull: undoes any drift between the copies
    return 0


def main(argv=None):
    global tf
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    cluster = resolve_cluster(args)  # {"ps": [host:port, ...], "worker": [...]}, or TF_CONFIG's
    if len(cluster["ps"]) > 1:  # the step applied on ps 0 would reach the others' variables dense
        fail("%s runs on one ps, not %d: its messages meet on ps 0, which applies each step "
             "to the parameters there (give one ps host; NUM_PS=1 for run.sh)"
             % (EXAMPLE, len(cluster["ps"])))
    if args.levels > 127:
        fail("--levels %d does not fit QSGD's int8 levels: at most 127" % args.levels)
    if args.ratio > 1:
        fail("--ratio %g: the fraction of entries sent is at most 1" % args.ratio)
    data = load_dataset(args.data_path) if args.job_name == "worker" else None  # a ps needs none
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf  # only now: bad input has failed in one line, before its start-up
    tf.compat.v1.disable_eager_execution()  # graphs and sessions: the tf.compat.v1 runtime
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # no deprecation notes
    # the cluster, every task's address by job, and this task's server in it (gRPC): the ps
    # tasks' servers hold the variables, the workers' run the steps (one thread: on one machine
    # the tasks share its cores)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), args.job_name, args.task_index,
                                  config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))
    with errors_in_one_line(args):  # a lost peer, a timeout: one line that says so
        if args.job_name == "ps":
            return serve(args, cluster, server)  # a ps only serves, until the chief ends the run
        return train(args, cluster, server, data)


# ==================================================================================================
# Plumbing of the synchronous examples: a step waits at most --step_timeout, so that a lost worker
# ends the run in one line
# ==================================================================================================
# >>> shared: sync replicas
def sync_round(session, fetches, args, name, feed_dict=None):
    """Run fetches, a synchronous step or round: it waits for the other workers, at most
    --step_timeout, so that a lost quorum ends the run in one line instead of hanging it."""
    try:
        return session.run(fetches, feed_dict, options=tf.compat.v1.RunOptions(
            timeout_in_ms=int(args.step_timeout * 1000)))
    except tf.errors.DeadlineExceededError:
        no_round_in_time(args, name)


def no_round_in_time(args, name):
    """The run ends in one line: no step or round (name) completed within --step_timeout."""
    fail("worker%d: no %s completed within %g s: a worker is missing"
         % (args.task_index, name, args.step_timeout))
# <<< shared: sync replicas


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# train() hands this part what it built: the step's tensors, the test metrics and the test set;
# nothing here knows the data, the model or the algorithm. The session is TensorFlow's
# MonitoredSession: a session creator on SessionManager, TensorFlow's hooks (StopAtStepHook,
# CheckpointSaverHook: the chief saves every 30 s and at the end) and hooks of this file's for
# what TensorFlow lacks. In this order; the same text in every train.py that runs on a ps (a
# test keeps the copies equal):
#   1. flags, each number of its type, and the cluster from them  parse_flags, number_type,
#      or from TF_CONFIG; --data_path's file, checked             resolve_cluster, check_cluster,
#                                                                  read_npz, Pixels, as_float32,
#                                                                  port_taken
#   2. each variable cut into a slice per ps, if asked            sharded_over_the_ps
#   3. a failure ends the task in one line                        errors_in_one_line, fail, cause
#   4. the session: a worker waits for the ps, then for the       Worker, reach_the_ps, wait_for,
#      chief, who restores the latest checkpoint or initialises   is_listening, StartOrRejoin,
#      where the ps lacks the variables; after a step lost to a   Hook, ExampleHook
#      restarted task, a new session, set up again
#   5. progress lines; the chief's test metrics over the test
#      set, in batches, to TensorBoard too                         Progress, test_metrics_in_batches,
#                                                                  tensorboard_summary
#   6. the end: the chief waits for the others, names any it
#      lost, prints the summary line and ends the run; a ps
#      serves until then (a TensorFlow server never ends itself)  RunStatus, print_summary, serve,
#                                                                  run_over_flag
#   7. a worker whose steps stop (--watchdog) exits, for its
#      restart policy to start it again                           Watchdog
#   8. the data's way in: TFRecord files, each worker reading      read_records, check_shards,
#      its own; arrays that are no constant of the graph; the     count_records, records_dataset,
#      test set in batches; each session's order of the           parse_records, arrays_dataset,
#      training stream; a Keras model's weights as the            example_shape, test_batches,
#      parameters                                                 record_batches, session_stream,
#                                                                  start_the_data, keras_params,
#                                                                  keras_logits
# >>> shared: flags
def fail(message):
    """One line on stderr and exit status 2: for bad input and lost peers, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def number_type(kind, positive):
    """A flag's type: a number of kind, more than 0 if positive, else 0 or more (NaN neither)."""
    def parse(text):
        value = kind(text)  # not a number: a ValueError, and argparse says "invalid ... value"
        if not (value > 0 if positive else value >= 0):
            raise argparse.ArgumentTypeError("must be %s, got %s"
                                             % ("positive" if positive else "0 or more", text))
        return value
    parse.__name__ = ("positive_" if positive else "non_negative_") + kind.__name__
    return parse


positive_int, positive_float = number_type(int, True), number_type(float, True)
non_negative_int, non_negative_float = number_type(int, False), number_type(float, False)


def parse_flags(argv, example_flags):
    """The flags every example shares (a cluster's, where JOBS names one), then its own."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: fail(  # "--steps must be positive, got 0", or argparse's words
        message.replace("argument ", "", 1).replace(": must be", " must be")
        if ": must be" in message else message + " (see --help)")
    common = [
        ("steps", positive_int, 2000, "mini-batches to train, summed over the workers"),
        ("batch_size", positive_int, 64, "examples per mini-batch"),
        ("learning_rate", positive_float, 0.1, "the workers' learning rate"),
        ("hidden", positive_int, 128, "width of the MLP's hidden layer"),
        ("data_path", str, "", "an .npz of x_train, y_train, x_test, y_test, or a folder of "
         "TFRecord files (tools/npz_to_tfrecord.py) (default: the digits)"),
        ("log_dir", str, "", "checkpoints and summaries; one that has them resumes"),
        ("seed", non_negative_int, 0, "seed of the initial weights and the shuffling"),
        ("log_every", positive_int, 100, "progress (the chief's: test metrics) every N local steps"),
    ]
    cluster = [
        ("job_name", str, "", "ps or worker (or set TF_CONFIG)"),
        ("task_index", non_negative_int, 0, "this task's index in its job"),
        ("ps_hosts", str, "", "comma-separated host:port of the ps tasks"),
        ("worker_hosts", str, "", "comma-separated host:port of the workers"),
        ("connect_timeout", positive_float, None, "seconds to wait for the other tasks; if not "
         "given, 60, or 600 under TF_CONFIG (a cluster's pods may start minutes apart)"),
        ("watchdog", positive_float, 300.0, "a worker whose step has not returned for this many "
         "seconds exits, for its restart policy to start it again (the examples with a ps)"),
    ]
    for flag, kind, default, text in common + (cluster if JOBS else []):
        p.add_argument("--" + flag, type=kind, default=default, help=text)
    example_flags(p)
    args = p.parse_args(argv)
    if not args.log_dir:  # a new folder for every run, beside this file
        run_name = time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
        args.log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", run_name)
    return args
# <<< shared: flags


# >>> shared: data files
Records = collections.namedtuple("Records", "train_files test_files shape dtype scale num_classes")


def read_records(path):
    """--data_path's TFRecord files, checked before TensorFlow loads: a folder, or a glob of its
    training files, as tools/npz_to_tfrecord.py writes them: train-*.tfrecord and
    test-*.tfrecord, each record a tf.train.Example with the features x (the example's array,
    its raw bytes) and y (its label: int64 for classes, float for a regression), and meta.json
    (x_shape, x_dtype, x_scale: x is divided by it; num_classes: null for a regression;
    train_examples and test_examples). The files of each part are all N of one write
    (PART-K-of-N), holding the examples meta.json counts: never a glob's test files, nor an
    older write's files left in the folder, trained on."""
    if os.path.isdir(path):
        folder, train_files = path, sorted(glob.glob(os.path.join(path, "train-*.tfrecord")))
    else:
        train_files = sorted(glob.glob(path))
        folder = os.path.dirname(train_files[0]) if train_files else os.path.dirname(path)
    tested = [f for f in train_files if os.path.basename(f).startswith("test-")]
    if tested:  # a glob as broad as DIR/*.tfrecord
        fail("%s takes test files (%s) as training files: give the folder, or a glob of its "
             "train-*.tfrecord" % (path, os.path.basename(tested[0])))
    if not train_files:
        fail("%s: no training files (train-*.tfrecord): give an .npz, or a folder of TFRecord "
             "files that tools/npz_to_tfrecord.py wrote" % path)
    test_files = sorted(glob.glob(os.path.join(folder, "test-*.tfrecord")))
    if not test_files:
        fail("%s: no test files (test-*.tfrecord) beside the training files" % folder)
    check_shards(folder, train_files, "train")  # one write's, whole: not two writes' mixed
    check_shards(folder, test_files, "test")
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        shape, dtype = tuple(int(n) for n in meta["x_shape"]), np.dtype(meta["x_dtype"])
        scale, num_classes = float(meta["x_scale"]), meta["num_classes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("%s: no readable meta.json (%s: %s) beside the TFRecord files: write them with "
             "python tools/npz_to_tfrecord.py DATA.npz FOLDER" % (folder, type(e).__name__, e))
    counts = {part: sum(count_records(name) for name in files)
              for part, files in (("train", train_files), ("test", test_files))}
    for part in ("train", "test"):
        if meta.get(part + "_examples", counts[part]) != counts[part]:
            fail("%s: its %s files hold %d examples, meta.json says %d: files of another "
                 "write? Write the folder again, into an empty one (tools/npz_to_tfrecord.py)"
                 % (folder, part, counts[part], meta[part + "_examples"]))
    return Records(train_files, test_files, shape, dtype, scale, num_classes)


def check_shards(folder, files, part):
    """files are one write's PART-K-of-N.tfrecord, all N of them: not two writes' mixed."""
    totals = sorted({os.path.basename(f).rsplit("-of-", 1)[-1].split(".")[0] for f in files})
    if len(totals) != 1 or not totals[0].isdigit() or int(totals[0]) != len(files):
        fail("%s: its %s files are not the %s of one write (%d file(s), %s): write the folder "
             "again, into an empty one (tools/npz_to_tfrecord.py)" % (
                 folder, part, "N files -of-N" if len(totals) == 1 else "same -of-N",
                 len(files), " and ".join("-of-" + t for t in totals)))


def count_records(name):
    """The records in a TFRecord file, read from their headers alone (each: its length, 8
    bytes, and its checksum, 4; then the data and its checksum). Not one: a one-line error."""
    size, records, offset = os.path.getsize(name), 0, 0
    with open(name, "rb") as f:
        while offset < size:
            header = f.read(12)
            length = int.from_bytes(header[:8], "little") if len(header) == 12 else -1
            if not 0 < length <= size - offset - 16:
                fail("%s is not a TFRecord file (tools/npz_to_tfrecord.py writes them)" % name)
            offset += 16 + length
            f.seek(offset)
            records += 1
    return records


def records_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches from its own TFRecord files (file k goes to
    worker k mod N): no worker reads, or holds, the whole set. Every epoch, its files in a new
    order, read a few at a time, interleaved; records shuffled in a buffer of 10,000, batched,
    then parsed and scaled a batch at a time, in parallel, ahead of the training step."""
    if len(data.train_files) < num_workers:
        fail("%d training file(s) for %d workers: each worker reads files of its own; write at "
             "least %d (tools/npz_to_tfrecord.py --shards N)"
             % (len(data.train_files), num_workers, num_workers))
    if isinstance(worker_index, int):
        mine = data.train_files[worker_index::num_workers]
        uneven = len(data.train_files) % num_workers
        print("[worker%d] reading %d of %d training files: %s%s" % (
            worker_index, len(mine), len(data.train_files), ",".join(
                os.path.basename(f) for f in mine), "" if not uneven else (
                " (uneven: %d files over %d workers, so the examples of a worker with fewer "
                "files come more often; write a multiple of %d shards)" % (
                    len(data.train_files), num_workers, num_workers))), flush=True)
    files = tf.data.Dataset.from_tensor_slices(data.train_files).shard(num_workers, worker_index)
    records = files.shuffle(len(data.train_files), seed=seed).interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    records = records.shuffle(10000, seed=seed).repeat().batch(batch_size, drop_remainder=True)
    return records.map(parse_records(data), tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def parse_records(data):
    """The parser of a batch of the files' records (tf.train.Examples): x in float32, scaled
    to [0, 1], and y. Training and the chief's test set read the files through this one."""
    def parse(serialized):
        features = tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([], tf.int64 if data.num_classes else tf.float32)})
        x = tf.reshape(tf.io.decode_raw(features["x"], data.dtype), (-1,) + data.shape)
        return tf.cast(x, tf.float32) / data.scale, features["y"]
    return parse


ARRAYS_IN_A_GRAPH_MB = 256  # ParameterServerStrategy's traced dataset function: larger arrays
# are refused (each worker would hold the graph's copy, and a GraphDef holds 2 GB at most)


def arrays_dataset(x, y, worker_index, num_workers, seed):
    """This worker's shard of the arrays (x, y), example by example, in a new order every epoch,
    integer pixels (Pixels) a byte each until they leave the shuffle. Never a constant of a
    tf.compat.v1 graph (its GraphDef would hold the arrays: 2 GB at most, and copies in memory):
    the graph asks Python for the shard when the pipeline starts. In TensorFlow 2 the arrays
    themselves; ParameterServerStrategy traces its dataset function, which makes them a constant
    of a graph that every worker holds, so arrays over ARRAYS_IN_A_GRAPH_MB are refused there."""
    pixels, scale = (x.pixels, x.scale) if isinstance(x, Pixels) else (np.asarray(x), None)
    if tf.compat.v1.executing_eagerly_outside_functions():
        size = (pixels.nbytes + np.asarray(y).nbytes) / 2**20
        if not tf.executing_eagerly() and size > ARRAYS_IN_A_GRAPH_MB:  # traced: a constant
            fail("%.0f MB of training arrays would be a constant of the traced dataset function, "
                 "on every worker (at most %d MB): write them as TFRecord files (python "
                 "tools/npz_to_tfrecord.py DATA.npz FOLDER) and give --data_path FOLDER"
                 % (size, ARRAYS_IN_A_GRAPH_MB))
        examples = tf.data.Dataset.from_tensor_slices((pixels, y)).shard(num_workers,
                                                                         worker_index)
    else:
        shard = lambda: (pixels[worker_index::num_workers], y[worker_index::num_workers])
        arrays = tf.data.Dataset.range(1).map(lambda _: tuple(tf.compat.v1.py_func(
            shard, [], [tf.as_dtype(pixels.dtype), tf.as_dtype(y.dtype)], stateful=False)))
        examples = arrays.map(lambda xs, ys: (tf.ensure_shape(xs, (None,) + x.shape[1:]),
                                              tf.ensure_shape(ys, (None,) + y.shape[1:]))).unbatch()
    examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)  # the shards differ
    if scale is None:
        return examples
    return examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))


def example_shape(data):
    """The shape of one example: the arrays' rows, or the TFRecord files' x_shape."""
    return data.shape if isinstance(data, Records) else data.x_train.shape[1:]


def test_batches(test_set, size=1000):
    """The test set, size examples at a time: the data (its x_test and y_test), the arrays
    (x, y), or TFRecord files (Records: read as they stream, never all in memory)."""
    if not isinstance(test_set, Records):
        x, y = (test_set.x_test, test_set.y_test) if hasattr(test_set, "x_test") else test_set
        return ((x[i:i + size], y[i:i + size]) for i in range(0, len(x), size))
    return record_batches(test_set, size)


def record_batches(data, size):
    """The test files' examples, size at a time, as they stream from the files: a
    TFRecordDataset parsed as training parses them (parse_records), in a graph of its own."""
    graph = tf.Graph()
    with graph.as_default():  # left before the first yield: the caller's graph stays its own
        batches = tf.data.TFRecordDataset(data.test_files).batch(size).map(parse_records(data))
        next_batch = tf.compat.v1.data.make_one_shot_iterator(batches).get_next()
    session = tf.compat.v1.Session(graph=graph)  # not as a "with": that makes it the default
    try:
        while True:
            try:
                x, y = session.run(next_batch)
            except tf.errors.OutOfRangeError:
                return
            yield x, y
    finally:
        session.close()


DATA_STARTS = ("data_starts", "data_start_steps")  # session_stream's: graph collections


def session_stream(dataset, seed, worker_index):
    """The next element of dataset(session_seed), as tensors of the graph. Every session starts
    the stream anew (start_the_data), its seed drawn from seed, this worker and the global step
    at the session's start: no two workers share an order, and after a restart or a resume a
    worker does not replay the mini-batches it began with."""
    start_step = tf.compat.v1.placeholder_with_default(np.int64(0), [], name="data_start_step")
    iterator = tf.compat.v1.data.make_initializable_iterator(
        dataset((seed * 1000 + worker_index) * 1000003 + start_step))
    tf.compat.v1.add_to_collection(DATA_STARTS[0], iterator.initializer)
    tf.compat.v1.add_to_collection(DATA_STARTS[1], start_step)
    return iterator.get_next()


def start_the_data(session, global_step):
    """Start every training stream of the graph (session_stream) in a new session, at
    global_step."""
    starts, steps = (tf.compat.v1.get_collection(name) for name in DATA_STARTS)
    session.run(starts, {step: global_step for step in steps})
# <<< shared: data files


# >>> shared: keras
KERAS_MODELS = {}  # by names: the Keras model, the parameters keras_params made of it, and the
# graph's name scope then (the start of its weights' names)


def keras_params(model):
    """A built Keras model's weights as an example's parameters: {name: variable}, in the order
    the model made them (Keras 3's variables hold TensorFlow ones: those, which the examples'
    loops differentiate and update). Remembered, so that keras_logits finds the model again.
    The examples run every layer as at test and train every weight by its gradient, so a model
    that acts otherwise in training is refused in one line: a layer that drops or adds noise at
    random (Dropout, GaussianNoise, a Random* augmentation), weights not trained by gradients
    (BatchNormalization's moving statistics, a frozen layer), or losses of the model's own (a
    regulariser) that model_loss does not add."""
    def refused():
        for layer in model._flatten_layers(include_self=False):
            kind = "layer %s (%s)" % (layer.name, type(layer).__name__)
            if type(layer).__name__.startswith("Random") or any(
                    getattr(layer, rate, 0) for rate in ("rate", "dropout", "recurrent_dropout",
                                                         "stddev")):
                return kind + " acts at random in training"
            if layer.non_trainable_weights and not list(layer._flatten_layers(include_self=False)):
                return kind + " has weights not trained by gradients"
        if model.losses:
            return "regulariser (model.losses) adds to the loss"
    reason = refused()
    if reason:
        fail("the Keras model's %s: the examples run every layer as at test, train every weight "
             "by its gradient and minimise model_loss alone; take it out, or write that part with "
             "raw variables (docs/own-model.md)" % reason)
    params = {}
    for w in model.weights:
        name = getattr(w, "path", None) or w.name.split(":")[0]
        params[name] = w if isinstance(w, tf.Variable) else w.value
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    KERAS_MODELS[tuple(params)] = (model, params, scope + "/" if scope else "")
    return params


def keras_logits(params, x):
    """The logits, for the examples x, of the Keras model behind params, computed with params'
    values: the model itself over its own weights; over any other dict of the same names (a
    worker's local copy, the parameters plus noise), the model built again (tf_keras's
    clone_model, in the tf.compat.v1 examples) with each weight taken from params by its name
    (and checked for its shape): the copy's names are the model's, built in a scope of its own."""
    model, own, scope = KERAS_MODELS[tuple(params)]
    if params is own:
        return model(x)
    import tf_keras
    taken = {}  # no weight of the dict twice

    def weight_by_name(next_creator, **kwargs):
        graph_scope = tf.compat.v1.get_default_graph().get_name_scope()
        name = graph_scope[len(copy_scope):] + "/" + kwargs["name"]  # as the model names it
        found = [n for n in params if n == scope + name] or [
            n for n in params if n == name or n.endswith("/" + name)]
        if len(found) != 1 or found[0] in taken:
            raise ValueError("keras_logits: the copy's weight %s matches %s of the model's "
                             "weights %s" % (name, found or "none", list(params)))
        shape = tf.TensorShape(kwargs.get("shape"))
        if not shape.is_compatible_with(params[found[0]].shape):
            raise ValueError("keras_logits: the copy's weight %s has the shape %s, the dict's %s"
                             % (name, shape, params[found[0]].shape))
        taken[found[0]] = True
        return params[found[0]]
    with tf.compat.v1.name_scope("keras_copy") as copy_scope:  # a fresh scope: no name taken
        with tf.variable_creator_scope(weight_by_name):
            return tf_keras.models.clone_model(model)(x)  # (a model built at its first call)
# <<< shared: keras


# >>> shared: tasks
def check_cluster(cluster, job, index):
    """Every address is host:port, the job is one of the cluster's, the index is in range."""
    for name, hosts in cluster.items():
        for address in hosts:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                fail("%s hosts: %r is not host:port (for example localhost:2222)"
                     % (name, address))
    if job not in cluster:
        fail("unknown job name %r: use %s" % (job, " or ".join(cluster)))
    if not 0 <= index < len(cluster[job]):
        fail("task index %d is out of range: the %s job has %d task(s), 0..%d"
             % (index, job, len(cluster[job]), len(cluster[job]) - 1))


def cause(error):
    """The line of a TensorFlow error that says what went wrong (not where, nor the trace)."""
    lines = [line for line in error.message.splitlines()  # not a rule of ====, nor indented
             if any(c.isalpha() for c in line) and not line.startswith((" ", "\t", "Node: "))]
    return lines[-1] if lines else type(error).__name__


def is_listening(address):
    try:
        socket.create_connection(address.rsplit(":", 1), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for(condition, seconds=float("inf"), waiting=None):
    """Whether condition() came true within seconds; waiting() says every 30 s what for."""
    started = last_line = time.time()
    while not condition():
        if time.time() > started + seconds:
            return False
        if waiting and time.time() > last_line + 30:
            print("%s (%.0f s so far)" % (waiting(), time.time() - started), flush=True)
            last_line = time.time()
        time.sleep(0.25)  # the pace of the checks
    return True
# <<< shared: tasks


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: test metrics
def test_metrics_in_batches(session, metrics, x, y, test_set):
    """Each of metrics (tensors, each a mean over a batch) averaged over the whole test set, fed
    1000 examples at a time into the placeholders x and y (test_batches): a large test set never
    becomes a graph constant, nor needs to fit in memory."""
    totals, examples = dict.fromkeys(metrics, 0.0), 0
    for x_test, y_test in test_batches(test_set):
        feed = {x: x_test, y: y_test}
        for name, value in session.run(metrics, feed).items():
            totals[name] += value * len(feed[x])
        examples += len(feed[x])
    return {name: float(total / examples) for name, total in totals.items()}


def tensorboard_summary(metrics, loss=None):
    """The test metrics (test_NAME), and the training loss if given, as one TensorBoard
    summary."""
    summary = tf.compat.v1.Summary()
    for name, value in metrics.items():
        summary.value.add(tag="test_" + name, simple_value=value)
    if loss is not None:
        summary.value.add(tag="loss", simple_value=loss)
    return summary
# <<< shared: test metrics


# >>> shared: cluster and session
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG as operators write it: a "chief" or
    "master" becomes worker 0, an "evaluator" has nothing to do. Sets job_name and task_index,
    and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
    job, index = args.job_name, args.task_index
    from_flags = job or args.ps_hosts or args.worker_hosts or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not args.ps_hosts or not args.worker_hosts:
            fail("give --ps_hosts and --worker_hosts (or set TF_CONFIG)")
        cluster = {"ps": args.ps_hosts.replace(" ", "").split(","),
                   "worker": args.worker_hosts.replace(" ", "").split(",")}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = config["cluster"], config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = list(spec.get("chief", [])) + list(spec.get("master", []))
            cluster = {"ps": list(spec["ps"]), "worker": chief + list(spec.get("worker", []))}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if job in ("chief", "master"):
            job, index = "worker", 0
        elif job == "worker":
            index += len(chief)  # the workers come after the chief
        elif job == "evaluator":
            print("[evaluator] nothing to do: the chief evaluates", flush=True)
            sys.exit(0)
    check_cluster(cluster, job, index)
    args.job_name, args.task_index = job, index
    if port_taken(cluster[job][index]):  # in one line here, rather than deep inside gRPC
        fail("%s %d: port %s is already in use: by an earlier run, or another program?"
             % (job, index, cluster[job][index]))
    return cluster


def sharded_over_the_ps(cluster, shard=True):
    """A variable scope in which each variable made is cut into one slice per ps task (along its
    first axis), so that every ps holds, and every ps link carries, an equal share of its bytes:
    replica_device_setter places whole variables, and one large matrix then loads one ps. Optimizers
    update the slices; the model reads each variable whole. shard=False: a scope that changes
    nothing."""
    partitioner = tf.compat.v1.fixed_size_partitioner(len(cluster["ps"])) if shard else None
    return tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), partitioner=partitioner)


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (a peer lost, a wait timed out) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        fail("%s %d stopped: %s: %s" % (args.job_name, args.task_index, type(e).__name__,
                                        cause(e)))


def reach_the_ps(args, cluster):
    """Wait until every ps listens, at most --connect_timeout: a worker starts after it, and
    after it restarted."""
    silent = lambda: [ps for ps in cluster["ps"] if not is_listening(ps)]
    if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
            "[worker%d] waiting for the ps at %s" % (args.task_index, ",".join(silent())))):
        fail("cannot reach the ps at %s: is it running?" % ",".join(silent()))


def run_over_flag(ps_index):
    """A flag on each ps that the chief raises when the run is over: every worker has finished
    or is lost. A ps reads its own, so ending needs no other task."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % ps_index)


def serve(args, cluster, server):
    """A ps serves until the chief says the run is over; TensorFlow's server never ends by
    itself. A ps whose flag no chief has set up within connect_timeout seconds, while the
    chief's port stays closed, served no one: it ends with an error (a chief that listens may be
    building a large graph: the ps waits on). The flag's variable has the same name in every
    task's graph, so the ps reads the one the chief writes."""
    index, connect_timeout = args.task_index, args.connect_timeout
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % index]))  # this ps alone: nothing else to wait for
    print("[ps%d] serving %d worker(s) at %s" % (index, len(cluster["worker"]),
                                                 cluster["ps"][index]), flush=True)
    chief = cluster["worker"][0]
    while not wait_for(lambda: session.run(set_up), connect_timeout, waiting=lambda: (
            "[ps%d] waiting for the chief (worker0) at %s" % (index, chief))):
        if not is_listening(chief):  # a chief that listens is alive, building its graph
            fail("ps%d: no chief at %s within %g s: this ps served no one" % (
                index, chief, connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[ps%d] the run is over; shutting down" % index, flush=True)
    return 0


class Worker(object):
    """A worker's part of the run besides its algorithm: test_metrics(x, y), the metric tensors
    of a batch of test examples, fed test_set (the data, or arrays (x, y)) in batches; the run's
    status on ps 0 (for each worker NOT_STARTED, TRAINING, or its local steps once finished;
    after ps 0 restarts the chief writes back what it last read); and session(). rejoins=False
    (Evolution-Strategies' chief): a restart, or a lost session, ends the task in one line."""
    NOT_STARTED, TRAINING = -2, -1
    GLOBAL_STEP_READ = "global_step_read_op_cache"  # tensorflow/python/training/training_util.py

    def __init__(self, args, cluster, test_metrics, test_set, steps_per_update=1, rejoins=True):
        self.args, self.cluster, self.test_set = args, cluster, test_set
        self.steps_per_update, self.rejoins = steps_per_update, rejoins
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        # TensorFlow's hooks (StopAtStepHook, CheckpointSaverHook) fetch the global step with
        # every run, through the tensor in the collection GLOBAL_STEP_READ (else their own, a
        # cond whose parts cross from the ps). Here Progress feeds it the global step the last
        # update returned, so that no run fetches it from the ps; a hook's own read, unfed
        # (when its stale value says the last step or a checkpoint is due), reads the ps.
        with tf.compat.v1.device(self.global_step.device):
            read = tf.identity(self.global_step, name="global_step_read")
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.step_seen = tf.compat.v1.placeholder_with_default(read, [], "global_step_seen")
        tf.compat.v1.get_collection_ref(self.GLOBAL_STEP_READ)[:] = [self.step_seen]
        x_test, y_test = next(test_batches(test_set, 1))  # an example: the placeholders' types
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.test_x = tf.compat.v1.placeholder(x_test.dtype, (None,) + x_test.shape[1:])
            self.test_y = tf.compat.v1.placeholder(y_test.dtype, (None,) + y_test.shape[1:])
            self.test_metrics = test_metrics(self.test_x, self.test_y)
        workers = len(cluster["worker"])
        with tf.compat.v1.device("/job:ps/task:0"):  # never checkpointed
            self.status = tf.compat.v1.Variable(np.full(workers, self.NOT_STARTED, np.int64),
                                                collections=[], name="run_status")
        self.my_status = tf.compat.v1.placeholder(tf.int64, [1])
        self.set_my_status = tf.compat.v1.scatter_update(self.status, [args.task_index],
                                                         self.my_status)
        self.run_over = [run_over_flag(k) for k in range(len(cluster["ps"]))]
        self.end_run = tf.group([flag.assign(True) for flag in self.run_over])
        if self.is_chief:  # a restarted chief, or a restarted ps, sets up only what is not there
            self.has_status = tf.compat.v1.is_variable_initialized(self.status)
            self.set_up = [(tf.compat.v1.is_variable_initialized(v), v.initializer)
                           for v in [self.status] + self.run_over]
            self.status_fed = tf.compat.v1.placeholder(tf.int64, [workers])
            self.write_back = self.status.assign(self.status_fed)
        self.status_seen = None  # the status as the chief last read it
        self.sessions, self.local_steps = 0, 0  # sessions made (StartOrRejoin), steps taken
        # the chief's last new session found the variables on the ps: it (or its session) was
        # restarted, the ps was not (a synchronous example's start-up reads it)
        self.kept_variables = False

    def session(self, server, loss, update, last_step=None, hooks=(), wait_for_everyone=False,
                minibatches_per_update=1, **summary):
        """TensorFlow's MonitoredSession, made by StartOrRejoin (wait_for_everyone: once every
        worker has started), with hooks: StopAtStepHook at last_step (None: the example stops
        itself), the example's own, Watchdog, RunStatus, the chief's CheckpointSaverHook (as a
        session starts, every 30 s, at the end) and Progress (update: a step's tensor, its value
        the global step after it; loss: the step's, or a placeholder the step feeds). After a
        step lost to a restart (Aborted, Unavailable) MonitoredSession makes a new session;
        closed, it runs the hooks' end: the chief waits for the others, saves, prints the
        summary line with the example's fields (values, tensors or functions) and ends the run."""
        creator = StartOrRejoin(self, server, wait_for_everyone)
        stop = [tf.compat.v1.train.StopAtStepHook(last_step=last_step)] if last_step else []
        hooks = stop + list(hooks) + [Watchdog(self.role, self.args.watchdog),
                                      RunStatus(self)]
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % self.args.log_dir, flush=True)
            hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                self.args.log_dir, save_secs=30, saver=creator.saver))
        hooks.append(Progress(self, loss, update, minibatches_per_update, summary, last_step))
        return tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks)

    def restore_or_initialise(self, session):
        """The chief's init_fn (StartOrRejoin): the run's status and the run-over flags set up
        where missing (the status it last read written back, after ps 0 restarted); then the
        latest checkpoint restored, or the variables initialised, only where the ps lacks them:
        a restarted chief goes on from the ps's global step, a restarted ps gets them back."""
        status_lost = not session.run(self.has_status)  # a new run, or ps 0 restarted
        for is_set_up, initializer in self.set_up:
            if not session.run(is_set_up):
                session.run(initializer)
        if status_lost and self.status_seen is not None:  # ps 0 restarted: the status back
            session.run(self.write_back, {self.status_fed: self.status_seen})
        self.kept_variables = len(session.run(self.not_ready)) == 0
        if not self.kept_variables:  # a new run, or the ps restarted
            checkpoint = tf.train.latest_checkpoint(self.args.log_dir)
            if checkpoint:
                self.saver.restore(session, checkpoint)
                print("[worker0] resuming from the checkpoint at global step %d"
                      % session.run(self.global_step), flush=True)
            else:
                session.run(self.initialise)
        elif self.sessions == 1:
            print("[worker0] resuming at global step %d: the ps kept the variables"
                  % session.run(self.global_step), flush=True)

    def read_status(self, session):
        """The run's status on ps 0; the chief keeps what it read, to write it back."""
        self.status_seen = session.run(self.status)
        return self.status_seen


class StartOrRejoin(object):
    """Worker.session's session creator (a SessionCreator's create_session) on SessionManager,
    as TensorFlow's ChiefSessionCreator and WorkerSessionCreator are, with two defaults
    corrected for tasks that leave and rejoin: the chief's prepare_session gets no
    checkpoint_dir (it would restore whenever a checkpoint exists, even over a ps that kept the
    run) but init_fn, restore_or_initialise; the others' wait_for_session checks every second
    (not every 30 s), at most --connect_timeout, then fails in one line. Each new session then
    starts the training stream (start_the_data) and marks the worker TRAINING. MonitoredSession
    calls it again after a lost step, with no pause nor limit: here a line says so, each try in
    a row comes a second later than the last, and the RETRIES-th ends the task in one line."""
    RETRIES = 6

    def __init__(self, worker, server, wait_for_everyone=False):
        self.worker, self.server, self.wait_for_everyone = worker, server, wait_for_everyone
        self.in_a_row, self.steps_then = 0, None  # new sessions with no step between them
        worker.saver = self.saver = tf.compat.v1.train.Saver()  # every global variable
        worker.initialise = tf.compat.v1.global_variables_initializer()
        worker.not_ready = tf.compat.v1.report_uninitialized_variables(
            tf.compat.v1.global_variables())
        worker.not_ready.mark_used()  # the chief's alone: no "never used" error elsewhere
        everything = (tf.compat.v1.global_variables() + tf.compat.v1.local_variables() +
                      [worker.status] + worker.run_over)  # the run's status too
        self.scaffold = tf.compat.v1.train.Scaffold(
            init_op=worker.initialise, saver=self.saver,
            ready_op=tf.compat.v1.report_uninitialized_variables(everything))

    def create_session(self):
        worker, args = self.worker, self.worker.args
        worker.sessions += 1
        if worker.sessions > 1:
            if not worker.rejoins:
                fail("%s: its session was lost to a restarted task, and %s cannot take up its "
                     "run again; start the whole run again" % (worker.role, EXAMPLE))
            same = worker.local_steps == self.steps_then
            self.in_a_row, self.steps_then = self.in_a_row + 1 if same else 1, worker.local_steps
            if self.in_a_row > self.RETRIES:
                fail("%s: %d sessions in a row lost to restarts, none took a step: is a task "
                     "restarting again and again?" % (worker.role, self.RETRIES))
            print("[%s] lost a step to a restart: a new session (%d in a row)"
                  % (worker.role, self.in_a_row), flush=True)
            time.sleep(self.in_a_row - 1)  # the pace of the tries: 0, 1, 2 ... s
        reach_the_ps(args, worker.cluster)
        self.scaffold.finalize()  # the graph is whole: a loop that adds ops would grow forever
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op,
            recovery_wait_secs=1)
        # filter devices, or the session waits for every worker to answer, even those that left
        config = tf.compat.v1.ConfigProto(device_filters=[
            "/job:ps", "/job:worker/task:%d" % args.task_index], intra_op_parallelism_threads=1)
        if worker.is_chief:
            session = manager.prepare_session(self.server.target, config=config,
                                              init_fn=worker.restore_or_initialise)
        else:
            try:
                session = manager.wait_for_session(self.server.target, config=config,
                                                   max_wait_secs=args.connect_timeout)
            except tf.errors.DeadlineExceededError:
                fail("%s: the chief has not set the variables up after %g s"
                     % (worker.role, args.connect_timeout))
        worker.started_at = int(session.run(worker.global_step))  # this session's start
        start_the_data(session, worker.started_at)  # an order of this session's
        if worker.sessions == 1 and not worker.rejoins and session.run(
                worker.status)[args.task_index] != worker.NOT_STARTED:  # it started once already
            fail("%s: %s cannot take a restarted worker back into a run in progress; start "
                 "the whole run again" % (worker.role, EXAMPLE))
        session.run(worker.set_my_status, {worker.my_status: [worker.TRAINING]})
        absent = lambda: [k for k, s in enumerate(session.run(worker.status))
                          if s == worker.NOT_STARTED]
        if self.wait_for_everyone and not wait_for(
                lambda: not absent(), args.connect_timeout, waiting=lambda: (
                    "[%s] waiting for worker(s) %s to start" % (worker.role, ",".join(
                        map(str, absent()))))):
            fail("%s: worker(s) %s did not start within %g s, and every round needs every "
                 "worker" % (worker.role, ",".join(map(str, absent())), args.connect_timeout))
        return session


class Hook(object):
    """tf.compat.v1.train.SessionRunHook's five methods, each doing nothing: the base of this
    file's hooks (TensorFlow loads after the flags are checked, so none derives from its own)."""
    begin = after_create_session = before_run = after_run = end = lambda self, *args: None


class RunStatus(Hook):
    """The run's status on ps 0, which TensorFlow lacks (StartOrRejoin marks a worker
    TRAINING). At its end a worker writes its local steps there; the chief then waits for every
    other worker to finish, to close its port while TRAINING (lost), or, NOT_STARTED, not to
    start within --connect_timeout, and names those it lost and those that never started."""

    def __init__(self, worker):
        self.worker = worker

    def end(self, session):
        worker = self.worker
        session.run(worker.set_my_status, {worker.my_status: [worker.local_steps]})
        if not worker.is_chief:
            return
        workers, my_end = worker.cluster["worker"], time.time()

        def still_to_come():  # neither finished, nor lost, nor too late to start
            late = time.time() > my_end + worker.args.connect_timeout
            return [k for k, s in enumerate(worker.read_status(session))
                    if s == worker.TRAINING and is_listening(workers[k])
                    or s == worker.NOT_STARTED and not late]
        wait_for(lambda: not still_to_come(), waiting=lambda: (
            "[worker0] waiting for worker(s) %s to finish" % ",".join(map(str, still_to_come()))))
        status = worker.read_status(session)  # after the wait
        lost = [k for k, s in enumerate(status) if s == worker.TRAINING]
        absent = [k for k, s in enumerate(status) if s == worker.NOT_STARTED]
        if lost:
            print("[worker0] worker(s) %s failed or were lost" % ",".join(map(str, lost)))
        if absent:
            print("[worker0] worker(s) %s never started (waited %g s)"
                  % (",".join(map(str, absent)), worker.args.connect_timeout))


class Progress(Hook):
    """A progress line every --log_every local steps, after each run of the update (the
    step's loss and global step fetched with it); on the chief with the test metrics over the
    test set, also to TensorBoard. At the end the chief's summary line, after which the run is
    over: every ps's run-over flag raised. (TensorFlow's LoggingTensorHook prints a step's
    tensors, not metrics of a test set fed in batches, nor a run's summary.)"""

    def __init__(self, worker, loss, update, minibatches_per_update, summary, last_step=None):
        self.worker, self.loss, self.update, self.last_step = worker, loss, update, last_step
        self.minibatches_per_update, self.summary = minibatches_per_update, summary
        self.history = []

    def begin(self):
        if self.worker.is_chief:  # the writer CheckpointSaverHook adds the graph to
            self.writer = tf.compat.v1.summary.FileWriterCache.get(self.worker.args.log_dir)

    def after_create_session(self, session, coord):
        self.step = self.worker.started_at  # the global step as this session starts
        if self.last_step and self.step >= self.last_step:  # the run is over: stop now
            coord.request_stop()  # (StopAtStepHook looks only after a step)
        if self.worker.sessions == 1:
            self.start_step = self.step
            self.start_clock()  # again at the first update
            print("[%s] training started" % self.worker.role, flush=True)

    def start_clock(self):
        """The run's clock (its rates, its history's seconds) starts once the first update has
        returned, in every example: set-up, and the first step's own preparation, untimed."""
        self.start_time = self.progress_time = time.time()
        self.timed_from_step, self.progress_steps = self.step, self.worker.local_steps

    def before_run(self, run_context):
        """A run of the update is a step: its value (the global step after it, which the run
        fetches anyway) comes back, the loss too with the first and with each that ends a
        --log_every interval (a fetch costs on every step)."""
        worker, fetches = self.worker, run_context.original_args.fetches
        self.updating = fetches is self.update or any(  # not a read
            fetch is self.update for fetch in tf.nest.flatten(fetches))
        seen = {worker.step_seen: self.step}  # the hooks' global step (Worker.step_seen)
        if not self.updating:
            return tf.compat.v1.train.SessionRunArgs(None, seen)
        every, after = worker.args.log_every, worker.local_steps + worker.steps_per_update
        if worker.local_steps == 0 or worker.local_steps // every != after // every:
            return tf.compat.v1.train.SessionRunArgs({"step": self.update, "loss": self.loss}, seen)
        return tf.compat.v1.train.SessionRunArgs({"step": self.update}, seen)

    def after_run(self, run_context, run_values):
        """Count the update; stop at last_step; every --log_every local steps a progress line."""
        worker = self.worker
        if not self.updating:
            return
        before = worker.local_steps
        worker.local_steps += worker.steps_per_update
        self.step = int(run_values.results["step"])
        if self.last_step and self.step >= self.last_step:  # as this update returns: the
            run_context.request_stop()  # global step StopAtStepHook reads may be an older one
        if "loss" not in run_values.results:
            return
        loss = float(run_values.results["loss"])
        if before == 0:  # the clock starts as the first update returns (start_clock)
            self.start_clock()
        if before // worker.args.log_every == worker.local_steps // worker.args.log_every:
            return
        rate = (worker.local_steps - self.progress_steps) / (time.time() - self.progress_time)
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            worker.role, worker.local_steps, self.step, loss)
        if worker.is_chief:
            for name, value in self.evaluate(run_context.session, self.step, loss).items():
                line += " test_%s=%.4f" % (name, value)
            worker.read_status(run_context.session)
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress_steps, self.progress_time = worker.local_steps, time.time()

    def evaluate(self, session, global_step, loss=None):
        """The test metrics, each a mean over the test set, fed 1000 examples at a time (a large
        test set is never a graph constant); also to TensorBoard, with the loss if given."""
        worker = self.worker
        metrics = test_metrics_in_batches(session, worker.test_metrics, worker.test_x,
                                          worker.test_y, worker.test_set)
        self.writer.add_summary(tensorboard_summary(metrics, loss), global_step)
        seconds = round(time.time() - self.start_time, 3)
        self.history.append([seconds, global_step] + list(metrics.values()))
        return metrics

    def end(self, session):
        """The chief's summary line, with the example's fields, once RunStatus has waited for
        the others and CheckpointSaverHook has saved; then the run is over."""
        worker = self.worker
        if worker.is_chief:
            status = worker.status_seen  # as RunStatus read it after its wait
            self.step = int(session.run(worker.global_step))
            summary = dict(example=EXAMPLE)
            for name, value in self.evaluate(session, self.step).items():  # what it saved
                summary["test_" + name] = value
            seconds = time.time() - self.start_time
            rate = (self.step - self.timed_from_step) * self.minibatches_per_update / seconds
            lost = [k for k, s in enumerate(status) if s in (worker.TRAINING, worker.NOT_STARTED)]
            summary.update(global_step=self.step, workers=len(worker.cluster["worker"]),
                           ps=len(worker.cluster["ps"]), lost_workers=len(lost),
                           local_steps=[max(int(s), -1) for s in status],
                           updates=self.step - self.start_step,
                           timed_from_step=self.timed_from_step, timed_seconds=seconds,
                           steps_per_sec=rate, examples_per_sec=rate * worker.args.batch_size)
            for key, value in self.summary.items():  # a value, a tensor, or a function
                value = value() if callable(value) else value
                summary[key] = float(session.run(value)) if tf.is_tensor(value) else value
            print_summary(worker.role, summary, self.history, worker.args.metrics_file)
            self.writer.flush()
            session.run(worker.end_run)  # the ps tasks end now
        print("[%s] done: local_steps=%d" % (worker.role, worker.local_steps), flush=True)


class ExampleHook(Hook):
    """An example's own start-up, each_session(session), run in every new session (after a
    restart too), and its own end, at_the_end(session), before the chief waits for the others:
    a synchronous optimizer's start-up and the spare tokens that release its workers."""

    def __init__(self, each_session, at_the_end=None):
        self.each_session, self.at_the_end = each_session, at_the_end

    def after_create_session(self, session, coord):
        self.each_session(session)

    def end(self, session):
        if self.at_the_end:
            self.at_the_end(session)


class Watchdog(Hook):
    """Once steps have begun, a worker that completes none for --watchdog seconds says so and
    ends its process, for its restart policy to start it again: a step that a peer's restart
    left waiting may never return, and nothing in TensorFlow interrupts it."""

    def __init__(self, role, seconds):
        self.role, self.seconds, self.last_step, self.watching = role, seconds, None, True

    def after_run(self, run_context, run_values):
        if self.last_step is None:  # the first step: the watch begins
            threading.Thread(target=self.watch, daemon=True).start()
        self.last_step = time.time()

    def watch(self):
        while self.watching:
            time.sleep(1)
            if self.watching and time.time() > self.last_step + self.seconds:
                print("error: %s completed no step for %g s (--watchdog): exiting, so that it "
                      "can be restarted" % (self.role, self.seconds), file=sys.stderr,
                      flush=True)
                os._exit(2)  # sys.exit would wait for the stuck step

    def end(self, session):
        self.watching = False
# <<< shared: cluster and session


if __name__ == "__main__":
    sys.exit(main())
