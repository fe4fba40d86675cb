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
    if data_path:  # an .npz (read_npz), or a folder of TFRecord files (read_records)
        return Dataset(*read_npz(data_path)) if data_path.endswith(".npz") else read_records(
            data_path)
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
    worker = Worker(args, cluster, lambda x, y: model_metrics(gc.global_params, x, y), data)

    def each_session(session, coord):
        # a restarted worker's copy and residual are not the others', and the ps's accumulators
        # may hold half a step: a restart ends the run in one line instead
        if worker.rejoining:
            fail("%s: %s cannot take a restarted worker back into a run in progress; start the "
                 "whole run again" % (worker.role, EXAMPLE))
        wait_for_everyone(session, worker)  # each step needs everyone
    loss, step = gc.step  # a step's values: its loss, and the global step after it
    with worker.session(server, loss, step, hooks=[Hook(after_create_session=each_session)],
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


def wait_for_everyone(session, worker):
    """Every round needs every worker: a new session waits until each has started (the run's
    status, Worker's), at most --connect_timeout."""
    absent = lambda: [k for k, status in enumerate(session.run(worker.status))
                      if status == worker.NOT_STARTED]
    if not wait_for(lambda: not absent(), worker.args.connect_timeout, waiting=lambda: (
            "[%s] waiting for worker(s) %s to start" % (worker.role, ",".join(
                map(str, absent()))))):
        fail("%s: worker(s) %s did not start within %g s, and every round needs every worker"
             % (worker.role, ",".join(map(str, absent())), worker.args.connect_timeout))


def no_round_in_time(args, name):
    """The run ends in one line: no step or round (name) completed within --step_timeout."""
    fail("worker%d: no %s completed within %g s: a worker is missing"
         % (args.task_index, name, args.step_timeout))
# <<< shared: sync replicas


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# train() hands it what it built (the step's tensors, the test metrics, the data): nothing here
# knows the model or the algorithm. Each block is the same text in every train.py that uses it (a
# test compares them); this file's, in order:
# flags, ps cluster, tasks, npz, records, graph arrays, graph stream, graph test set, summary, ps
# session.
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
        ("log_every", positive_int, 100, "a progress line (the chief's: with the test metrics) "
         "every N local steps"),
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


# >>> shared: ps cluster
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG as operators write it: a "chief" or
    "master" becomes worker 0, an "evaluator" has nothing to do. Sets job_name, task_index,
    address (this task's), and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
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
    args.job_name, args.task_index, args.address = job, index, cluster[job][index]
    return cluster


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (its port taken, a peer lost) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            fail("%s %d: port %s is already in use: by an earlier run, or another program?"
                 % (args.job_name, args.task_index, args.address))
        fail("%s %d stopped: %s: %s" % (args.job_name, args.task_index, type(e).__name__,
                                        cause(e)))
# <<< shared: ps cluster


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


# >>> shared: npz
def read_npz(path):
    """--data_path's .npz, checked before TensorFlow loads, as the Dataset's fields. Floats become
    float32; integer pixels stay a byte each, scaled to [0, 1] by x_train's largest (x_scale) in
    the pipeline; images (N, H, W) gain a channel axis; labels are whole numbers from 0."""
    names = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path) as f:
            x_train, y_train, x_test, y_test = arrays = [f[name] for name in names]
    except (OSError, KeyError, ValueError) as e:  # missing, unreadable, or a key missing
        fail("cannot load %s (%s): give an .npz with x_train, y_train, x_test and y_test"
             % (path, str(e).splitlines()[0]))
    for name, a in zip(names, arrays):
        if a.dtype.kind not in "biuf" or a.ndim == 0 or len(a) == 0:
            fail("%s: %s must be a non-empty array of numbers, not %s %s"
                 % (path, name, a.dtype, a.shape))
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            fail("%s: %s has NaN or infinite values" % (path, name))
        if name[0] == "y" and (a.ndim != 1 or np.any(a != np.round(a)) or a.min() < 0):
            fail("%s: %s must hold class labels: whole numbers from 0" % (path, name))
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        fail("%s: x and y differ in length: %d and %d to train, %d and %d to test"
             % (path, len(x_train), len(y_train), len(x_test), len(y_test)))
    if x_train.shape[1:] != x_test.shape[1:]:
        fail("%s: train and test examples differ in shape: %s and %s"
             % (path, x_train.shape[1:], x_test.shape[1:]))
    if x_train.ndim == 3:  # images without a channel axis
        x_train, x_test = x_train[..., np.newaxis], x_test[..., np.newaxis]
    scale = max(float(x_train.max()), 1.0) if x_train.dtype.kind in "biu" else 1.0
    if scale == 1.0:
        x_train, x_test = x_train.astype(np.float32), x_test.astype(np.float32)
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64), num_classes, scale
# <<< shared: npz


# >>> shared: records
class Records(collections.namedtuple("Records", "train_files test_files shape dtype x_scale "
                                           "num_classes")):
    """--data_path's TFRecord files (read_records), and their test set as it streams."""

    def test_batches(self, size):
        return tf.data.TFRecordDataset(self.test_files).batch(size).map(parse_records(self))


def read_records(folder):
    """--data_path's folder as tools/npz_to_tfrecord.py writes it: train-*.tfrecord and
    test-*.tfrecord (tf.train.Examples of x, the array's bytes, and y) and meta.json."""
    try:
        names = sorted(os.listdir(folder))
        train_files, test_files = ([os.path.join(folder, name) for name in names if name.startswith(
            part + "-") and name.endswith(".tfrecord")] for part in ("train", "test"))
        if not train_files or not test_files:
            raise ValueError("no %s-*.tfrecord files" % ("test" if train_files else "train"))
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        return Records(train_files, test_files, tuple(meta["x_shape"]), np.dtype(meta["x_dtype"]),
                       float(meta["x_scale"]), meta["num_classes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail("%s is no folder of TFRecord files (%s): write one with python "
             "tools/npz_to_tfrecord.py DATA.npz FOLDER" % (folder, e))


def records_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches from its own files (file k goes to worker
    k mod N): no worker reads the whole set. Every epoch its files in a new order, interleaved,
    the records shuffled in a buffer of 10,000, batched, then parsed a batch at a time."""
    if len(data.train_files) < num_workers:
        fail("%d training file(s) for %d workers: each worker reads files of its own; write at "
             "least %d (npz_to_tfrecord.py --shards)" % (len(data.train_files), num_workers,
                                                         num_workers))
    if isinstance(worker_index, int):  # (a tensor under ParameterServerStrategy)
        print("[worker%d] reading training files: %s" % (worker_index, ",".join(os.path.basename(
            f) for f in data.train_files[worker_index::num_workers])), flush=True)
    files = tf.data.Dataset.from_tensor_slices(data.train_files).shard(num_workers, worker_index)
    records = files.shuffle(len(data.train_files), seed=seed).interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
    records = records.shuffle(10000, seed=seed).repeat().batch(batch_size, drop_remainder=True)
    return records.map(parse_records(data), tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def parse_records(data):
    """The parser of a batch of records (training's, the test set's): x scaled to [0, 1], y."""
    def parse(serialized):
        features = tf.io.parse_example(serialized, {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([], tf.int64 if data.num_classes else tf.float32)})
        x = tf.reshape(tf.io.decode_raw(features["x"], data.dtype), (-1,) + data.shape)
        return tf.cast(x, tf.float32) / data.x_scale, features["y"]
    return parse
# <<< shared: records


# >>> shared: graph arrays
def arrays_dataset(x, y, worker_index, num_workers, seed, scale=1.0):
    """This worker's shard of the arrays (x, y), example by example, in a new order every epoch,
    integer pixels divided by scale. No constant of the graph (its GraphDef would hold the
    arrays: 2 GB at most, and copies in memory): it asks Python for them as it starts."""
    shard = (x[worker_index::num_workers], y[worker_index::num_workers])
    examples = tf.data.Dataset.from_generator(lambda: [shard], output_signature=tuple(
        tf.TensorSpec((None,) + a.shape[1:], a.dtype) for a in shard)).unbatch()
    examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)  # the shards differ
    if x.dtype.kind not in "biu":  # floats as they are; integer pixels scaled
        return examples
    return examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))
# <<< shared: graph arrays


# >>> shared: graph stream
def session_stream(dataset, seed, worker_index):
    """The next element of dataset(session_seed), as tensors of the graph. Every session starts
    the stream anew (start_the_data), its seed drawn from seed, this worker and the global step
    at the session's start: no two workers share an order, and after a restart or a resume a
    worker does not replay the mini-batches it began with."""
    start_step = tf.compat.v1.placeholder_with_default(np.int64(0), [], name="data_start_step")
    iterator = tf.compat.v1.data.make_initializable_iterator(
        dataset((seed * 1000 + worker_index) * 1000003 + start_step))
    tf.compat.v1.add_to_collection("data_starts", (iterator.initializer, start_step))
    return iterator.get_next()


def start_the_data(session, global_step):
    """Start every training stream of the graph (session_stream), in a new session."""
    for initializer, start_step in tf.compat.v1.get_collection("data_starts"):
        session.run(initializer, {start_step: global_step})
# <<< shared: graph stream


# >>> shared: graph test set
def test_metrics_of(test_metrics, data):
    """The test set, 1000 examples a batch, x in float32 as in training: a start op, each batch's
    (size, test_metrics(x, y)) and its feeds. TFRecord files stream (they may not fit in memory;
    feeds None: to the end); arrays are fed (no graph constant, and no stream to start: fast)."""
    if hasattr(data, "test_batches"):  # Records
        iterator = tf.compat.v1.data.make_initializable_iterator(data.test_batches(1000))
        x, y = iterator.get_next()
        return iterator.initializer, (tf.shape(x)[0], test_metrics(x, y)), None
    xs, y = (tf.compat.v1.placeholder(a.dtype, (None,) + a.shape[1:])
             for a in (data.x_test, data.y_test))
    scale = getattr(data, "x_scale", None)  # a Dataset's (integer pixels), none for other ids
    x = tf.cast(xs, tf.float32) / scale if scale and data.x_test.dtype.kind in "biu" else xs
    feeds = [{xs: data.x_test[i:i + 1000], y: data.y_test[i:i + 1000]}
             for i in range(0, len(data.x_test), 1000)]
    return None, (tf.shape(x)[0], test_metrics(x, y)), feeds


def mean_over_the_test_set(session, start, batch, feeds):
    """Each test metric, a mean over a batch, averaged over every example of the test set."""
    if start is not None:
        session.run(start)
    totals, examples = collections.Counter(), 0
    for feed in iter(dict, None) if feeds is None else feeds:  # (the stream's: {} until it ends)
        try:
            size, metrics = session.run(batch, feed)
        except tf.errors.OutOfRangeError:
            break
        totals.update({name: value * size for name, value in metrics.items()})
        examples += size
    return {name: float(totals[name] / examples) for name in metrics}
# <<< shared: graph test set


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: ps session
def run_over_flag(ps_index):
    """A flag on each ps that the chief raises when the run is over: each ps reads its own."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % ps_index)


def serve(args, cluster, server):
    """A ps serves until the chief says the run is over (a TensorFlow server never ends by
    itself). One whose flag no chief has set up within --connect_timeout, while the chief's port
    stays closed, served no one: an error (a chief that listens may be building a large graph).
    The flag has the same name in every task's graph, so the ps reads what the chief writes."""
    index, chief = args.task_index, cluster["worker"][0]
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % index]))  # this ps alone: nothing else to wait for
    print("[ps%d] serving %d worker(s) at %s" % (index, len(cluster["worker"]), args.address),
          flush=True)
    while not wait_for(lambda: session.run(set_up), args.connect_timeout, waiting=lambda: (
            "[ps%d] waiting for the chief (worker0) at %s" % (index, chief))):
        if not is_listening(chief):
            fail("ps%d: no chief at %s within %g s: this ps served no one"
                 % (index, chief, args.connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[ps%d] the run is over; shutting down" % index, flush=True)
    return 0


class Hook(object):
    """A SessionRunHook that does nothing but the methods given, as Hook(end=f) (TensorFlow
    loads after the flags are checked, so no class here derives from its own)."""
    begin = after_create_session = before_run = after_run = end = lambda *args: None

    def __init__(self, **methods):
        self.__dict__.update(methods)


class Worker(Hook):
    """This worker's part of the run besides its algorithm, handed test_metrics(x, y) and the
    data. session() is TensorFlow's MonitoredSession with this object its session creator and a
    hook (progress, the chief's test metrics, the watchdog, the end). The run's status lives on
    ps 0, never checkpointed: for each worker NOT_STARTED, TRAINING, or its local steps once
    finished (the chief's last read written back if ps 0 restarts)."""
    NOT_STARTED, TRAINING = -2, -1

    def __init__(self, args, cluster, test_metrics, data, steps_per_update=1):
        self.args, self.cluster, self.steps_per_update = args, cluster, steps_per_update
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        workers = len(cluster["worker"])
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.test_set = test_metrics_of(test_metrics, data)
            self.seen = tf.compat.v1.placeholder_with_default(
                np.full(workers, self.NOT_STARTED, np.int64), [workers])
            self.mine = tf.compat.v1.placeholder(tf.int64, [1])
        with tf.compat.v1.device("/job:ps/task:0"):
            self.status = tf.compat.v1.Variable(self.seen, collections=[], name="run_status")
        self.set_mine = tf.compat.v1.scatter_update(self.status, [args.task_index], self.mine)
        self.run_over = [run_over_flag(k) for k in range(len(cluster["ps"]))]
        self.end_run = tf.group([flag.assign(True) for flag in self.run_over])
        self.local_steps, self.sessions, self.status_seen, self.start_step = 0, 0, None, None
        self.watching = self.ps_lost = self.kept_variables = False

    def session(self, server, loss, update, last_step=None, hooks=(), minibatches_per_update=1,
                **summary):
        """The session on server, with TensorFlow's StopAtStepHook at last_step (None: the
        example stops itself), the example's hooks, and the chief's CheckpointSaverHook (as a
        session starts, every 30 s, at the end). update: a step's tensor, its value the global
        step after it; loss: the step's, or a placeholder it feeds; summary: the example's fields
        of the summary line (values, tensors or functions)."""
        self.server, self.loss, self.update, self.last_step = server, loss, update, last_step
        self.minibatches_per_update, self.summary = minibatches_per_update, summary
        self.saver = tf.compat.v1.train.Saver()  # every global variable; the save runs here
        variables = tf.compat.v1.global_variables()  # by ps: what a restarted one lacks
        self.by_ps = [(ps[5:].replace("/task:", ""), tf.compat.v1.report_uninitialized_variables(
            mine), tf.compat.v1.train.Saver(mine), tf.compat.v1.variables_initializer(mine))
            for ps in sorted({v.device for v in variables})
            for mine in [[v for v in variables if v.device == ps]]]
        self.set_up = [(tf.compat.v1.is_variable_initialized(v), v.initializer)
                       for v in [self.status] + self.run_over]
        everything = variables + tf.compat.v1.local_variables() + [self.status] + self.run_over
        self.scaffold = tf.compat.v1.train.Scaffold(
            saver=self.saver, ready_op=tf.compat.v1.report_uninitialized_variables(everything))
        hooks = ([tf.compat.v1.train.StopAtStepHook(last_step=last_step)] if last_step else []
                 ) + list(hooks) + [Hook(end=self.wait_for_the_others)]
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % self.args.log_dir, flush=True)
            self.writer = tf.compat.v1.summary.FileWriterCache.get(self.args.log_dir)
            hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                self.args.log_dir, save_secs=30, saver=self.saver))
        return tf.compat.v1.train.MonitoredSession(session_creator=self, hooks=hooks + [self])

    def create_session(self):
        """SessionManager's start-up, as TensorFlow's ChiefSessionCreator and WorkerSessionCreator
        make it, with two defaults corrected: the chief's prepare_session gets no checkpoint_dir
        (it would restore whenever a checkpoint exists, even over a ps that kept the run) but
        init_fn=restore_where_lost; the others' wait_for_session checks every second, not every
        30 s, for at most --connect_timeout. MonitoredSession calls it again after a step lost
        to a restarted task (Aborted, Unavailable)."""
        args, role = self.args, self.role
        self.watching = False  # waiting for the ps, or the chief, is no stuck step
        if self.sessions:
            print("[%s] lost a step to a restart: a new session" % role, flush=True)
        silent = lambda: [ps for ps in self.cluster["ps"] if not is_listening(ps)]
        if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
                "[%s] waiting for the ps at %s" % (role, ",".join(silent())))):
            fail("%s: cannot reach the ps at %s: is it running?" % (role, ",".join(silent())))
        self.scaffold.finalize()  # the graph is whole: a loop that adds ops would grow forever
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op, recovery_wait_secs=1)
        # filter devices, or the session waits for every worker to answer, even those that left
        config = tf.compat.v1.ConfigProto(device_filters=[
            "/job:ps", "/job:worker/task:%d" % args.task_index], intra_op_parallelism_threads=1)
        if self.is_chief:
            session = manager.prepare_session(self.server.target, config=config,
                                              init_fn=self.restore_where_lost)
        else:
            try:
                session = manager.wait_for_session(self.server.target, config=config,
                                                   max_wait_secs=args.connect_timeout)
            except tf.errors.DeadlineExceededError:
                fail("%s: the chief has not set the variables up after %g s"
                     % (role, args.connect_timeout))
        self.step = int(session.run(self.global_step))  # this session's start
        start_the_data(session, self.step)  # an order of this session's
        self.rejoining = self.sessions > 0 or (  # in the run before: a restarted task
            session.run(self.status)[args.task_index] != self.NOT_STARTED)
        session.run(self.set_mine, {self.mine: [self.TRAINING]})
        self.sessions += 1
        return session

    def restore_where_lost(self, session):
        """The chief's init_fn: the status and run-over flags set up where missing; each ps that
        lacks its variables (a new run, a ps restarted) gets the latest checkpoint's, or with
        none their initial values; a ps that kept them goes on (a restarted chief too)."""
        for is_set_up, initializer in self.set_up:
            if not session.run(is_set_up):
                session.run(initializer, {} if self.status_seen is None else {
                    self.seen: self.status_seen})
        lost = [(ps, saver, init) for ps, missing, saver, init in self.by_ps
                if len(session.run(missing))]
        checkpoint, self.kept_variables = tf.train.latest_checkpoint(self.args.log_dir), not lost
        for ps, saver, init in lost:
            saver.restore(session, checkpoint) if checkpoint else session.run(init)
        lost_ps = ",".join(ps for ps, _, _ in lost) if len(lost) < len(self.by_ps) else ""
        if lost_ps and not checkpoint:
            print("[worker0] %s lost its variables, and %s holds no checkpoint: they start "
                  "again from their initial values" % (lost_ps, self.args.log_dir), flush=True)
        elif lost and checkpoint:
            print("[worker0] resuming from the checkpoint at global step %d%s" % (session.run(
                self.global_step), " on " + lost_ps if lost_ps else ""), flush=True)
        elif not lost and not self.sessions:
            print("[worker0] resuming at global step %d: the ps kept the variables"
                  % session.run(self.global_step), flush=True)

    def after_create_session(self, session, coord):
        """The clock starts with the first session that came up; one that finds the run over
        stops."""
        if self.start_step is None:
            self.start_step = self.timed_from = self.step
            self.clock = time.time()
            print("[%s] training started" % self.role, flush=True)
            threading.Thread(target=self.watch, daemon=True).start()
        self.over = bool(self.last_step) and self.step >= self.last_step
        if self.over:
            coord.request_stop()  # (StopAtStepHook looks only after a step)

    def before_run(self, run_context):
        """A run of the update fetches its value (the global step after it) and the loss. A
        run that MonitoredSession retries in a new session that found the run over ends it
        instead: run again, it would land past last_step."""
        if self.over:
            raise tf.errors.OutOfRangeError(None, None, "the run is over")  # a clean end
        fetches = run_context.original_args.fetches
        self.updating = fetches is self.update or any(
            fetch is self.update for fetch in tf.nest.flatten(fetches))
        if self.updating:
            return tf.compat.v1.train.SessionRunArgs((self.update, self.loss))

    def after_run(self, run_context, run_values):
        """Count the update; stop at last_step as it returns (StopAtStepHook's own read of the
        global step may be an older one); a progress line every --log_every local steps."""
        if not self.updating:
            return
        self.last_run, self.watching, self.ps_lost = time.time(), True, False
        before, self.local_steps = self.local_steps, self.local_steps + self.steps_per_update
        self.step, loss = int(run_values.results[0]), float(run_values.results[1])
        if self.last_step and self.step >= self.last_step:
            run_context.request_stop()
        if before == 0:  # the clock starts as the first update returns
            self.clock, self.timed_from = time.time(), self.step
            self.progress = (before, self.clock)
        if before // self.args.log_every == self.local_steps // self.args.log_every:
            return
        rate = (self.local_steps - self.progress[0]) / (time.time() - self.progress[1])
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            self.role, self.local_steps, self.step, loss)
        if self.is_chief:
            for name, value in self.evaluate(run_context.session, loss).items():
                line += " test_%s=%.4f" % (name, value)
            self.status_seen = run_context.session.run(self.status)  # written back if ps 0 restarts
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress = (self.local_steps, time.time())

    def evaluate(self, session, loss=None):
        """The test metrics over the test set, to TensorBoard too (with the loss, if given)."""
        metrics = mean_over_the_test_set(session, *self.test_set)
        values = [("test_" + name, value) for name, value in metrics.items()]
        self.writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value) for tag, value in
            values + ([("loss", loss)] if loss is not None else [])]), self.step)
        return metrics

    def watch(self):
        """The watchdog: a worker whose step has not returned for --watchdog seconds ends its
        process, for a restart policy to start it again (a step that a peer's restart left
        waiting may never return). Once a ps is lost, the wait for it to come back (in the
        step, in gRPC's back-off, in a new session's start-up) has --connect_timeout."""
        while True:
            time.sleep(1)
            if not all(is_listening(ps) for ps in self.cluster["ps"]):
                self.ps_lost = True  # until the next step returns (after_run)
            flag = "--connect_timeout: a ps was lost" if self.ps_lost else "--watchdog"
            limit = self.args.connect_timeout if self.ps_lost else self.args.watchdog
            if self.watching and time.time() > self.last_run + limit:
                print("error: %s completed no step for %g s (%s): exiting, so that it can be "
                      "restarted" % (self.role, limit, flag), file=sys.stderr, flush=True)
                os._exit(2)  # sys.exit would wait for the stuck step

    def wait_for_the_others(self, session):
        """Before the chief's last checkpoint: this worker's local steps into the run's status;
        the chief then waits until every other worker has finished, has closed its port while
        TRAINING (lost), or, NOT_STARTED, has not started within --connect_timeout."""
        self.watching = False
        session.run(self.set_mine, {self.mine: [self.local_steps]})
        workers, my_end = self.cluster["worker"], time.time()

        def still_to_come():
            late = time.time() > my_end + self.args.connect_timeout
            self.status_seen = session.run(self.status)
            return [k for k, s in enumerate(self.status_seen) if s == self.TRAINING and
                    is_listening(workers[k]) or s == self.NOT_STARTED and not late]
        if self.is_chief:
            wait_for(lambda: not still_to_come(), waiting=lambda: "[worker0] waiting for "
                     "worker(s) %s to finish" % ",".join(map(str, still_to_come())))

    def end(self, session):
        """The chief's summary line, with the example's fields, once the others have finished and
        CheckpointSaverHook has saved; then the run is over: every ps's flag raised."""
        if self.is_chief:
            seconds = time.time() - self.clock  # the training's: not the last evaluation
            self.step, status = int(session.run(self.global_step)), self.status_seen
            summary = dict(example=EXAMPLE)
            summary.update(("test_" + n, v) for n, v in self.evaluate(session).items())
            lost = sum(s < 0 for s in status)  # TRAINING or NOT_STARTED
            if lost:
                print("[worker0] %d worker(s) failed, were lost or never started" % lost)
            summary.update(global_step=self.step, workers=len(status), ps=len(self.cluster["ps"]),
                           lost_workers=lost, local_steps=[max(int(s), -1) for s in status],
                           updates=self.step - self.start_step, steps_per_sec=(
                               self.step - self.timed_from) * self.minibatches_per_update / seconds)
            for key, value in self.summary.items():  # a value, a tensor, or a function
                value = value() if callable(value) else value
                summary[key] = float(session.run(value)) if tf.is_tensor(value) else value
            print_summary(self.role, summary)
            self.writer.flush()
            session.run(self.end_run)  # the ps tasks end now
        print("[%s] done: local_steps=%d" % (self.role, self.local_steps), flush=True)
# <<< shared: ps session


if __name__ == "__main__":
    sys.exit(main())
