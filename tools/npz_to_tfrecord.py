"""Write an .npz data set as TFRecord shards that every example's --data_path reads.

    python tools/npz_to_tfrecord.py DATA.npz OUT_DIR            # 24 training files
    bash Distributed-Setup/run.sh --data_path OUT_DIR        # each worker reads its own shards

DATA.npz holds x_train, y_train, x_test and y_test, as --data_path's .npz does, checked as it
is (no NaN or infinity, x_test of x_train's dtype). OUT_DIR, new or without shards (an older
set's files would be read with the new ones), gets:
  train-00000-of-00024.tfrecord ...   the training examples, dealt round-robin over the shards
  test-00000-of-0000M.tfrecord ...    the test examples (--test_shards M, default 1)
  meta.json                           x_shape, x_dtype, x_scale, num_classes, and the counts
                                      train_examples and test_examples
Each record is a tf.train.Example with two features:
  x  bytes: the example's array, its raw bytes in x_dtype, little-endian as decode_raw reads
     them (uint8 pixels stay one byte each),
     of shape x_shape (images (H, W) gain a channel axis: (H, W, 1)); the reader divides it
     by x_scale (integer pixels: the largest in x_train, as for an .npz; floats: 1)
  y  int64: the class, 0 to num_classes - 1; with --regression, float: the target (num_classes
     is then null)
A worker needs files of its own: write at least as many training shards as workers (more, of
some 100 MB each, let a worker read several at once and a larger cluster reuse them). Workers
that get unequal numbers of files see their examples unequally often: the default, 24, divides
evenly over 1, 2, 3, 4, 6, 8, 12 or 24 workers.
"""
import argparse
import json
import os
import sys

import numpy as np


def fail(message):
    print("error: " + message, file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz", help="x_train, y_train, x_test and y_test")
    p.add_argument("out_dir", help="the folder to write (made if missing)")
    p.add_argument("--shards", type=int, default=24,
                   help="training files: a multiple of the number of workers (default: 24)")
    p.add_argument("--test_shards", type=int, default=1, help="test files (default: 1)")
    p.add_argument("--regression", action="store_true",
                   help="y holds a regression's targets (floats), not classes")
    args = p.parse_args(argv)
    if args.shards < 1 or args.test_shards < 1:
        fail("--shards and --test_shards must be at least 1")
    present = os.listdir(args.out_dir) if os.path.isdir(args.out_dir) else []
    older = sorted(n for n in present if n == "meta.json" or n.endswith(".tfrecord"))
    if older:  # the reader takes every train-*.tfrecord of the folder: old and new together
        fail("%s holds a data set already (%s): write into a new folder, or remove its files first"
             % (args.out_dir, ", ".join(older[:3] + ["..."] * (len(older) > 3))))
    try:
        with np.load(args.npz) as f:
            arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, KeyError, ValueError) as e:
        fail("cannot load %s (%s): give an .npz with x_train, y_train, x_test and y_test"
             % (args.npz, str(e).splitlines()[0]))
    x_train, y_train = arrays["x_train"], arrays["y_train"]
    if arrays["x_test"].dtype.name != x_train.dtype.name:  # meta.json records one for both
        fail("%s: x_test is %s and x_train %s: save both in one dtype"
             % (args.npz, arrays["x_test"].dtype, x_train.dtype))
    for part in ("train", "test"):
        x, y = arrays["x_" + part], arrays["y_" + part]
        if x.dtype.kind not in "biuf" or len(x) == 0 or len(x) != len(y) or y.ndim != 1:
            fail("%s: x_%s and y_%s must be non-empty arrays of numbers, one label per example"
                 % (args.npz, part, part))
        if x.shape[1:] != x_train.shape[1:]:
            fail("%s: train and test examples differ in shape" % args.npz)
        for name, array in (("x_" + part, x), ("y_" + part, y)):
            if array.dtype.kind == "f" and not all(np.isfinite(array[i:i + 4096]).all()
                                                   for i in range(0, len(array), 4096)):
                fail("%s: %s has NaN or infinite values" % (args.npz, name))
        if not args.regression and (np.any(y != np.round(y)) or y.min() < 0):
            fail("%s: y_%s must hold class labels, whole numbers from 0 (or give --regression)"
                 % (args.npz, part))
    if args.shards > len(x_train) or args.test_shards > len(arrays["x_test"]):
        fail("more shards than examples: every file needs at least one")
    shape = x_train.shape[1:] + ((1,) if x_train.ndim == 3 else ())  # images gain a channel
    meta = dict(x_shape=list(shape), x_dtype=x_train.dtype.name,
                x_scale=1.0 if x_train.dtype.kind == "f" else max(float(x_train.max()), 1.0),
                num_classes=None if args.regression else int(max(
                    y_train.max(), arrays["y_test"].max())) + 1,
                train_examples=len(x_train), test_examples=len(arrays["x_test"]))

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    os.makedirs(args.out_dir, exist_ok=True)
    little_endian = x_train.dtype.newbyteorder("<")  # as decode_raw reads the bytes
    for part, shards in (("train", args.shards), ("test", args.test_shards)):
        x, y = arrays["x_" + part], arrays["y_" + part]
        names = [os.path.join(args.out_dir, "%s-%05d-of-%05d.tfrecord" % (part, k, shards))
                 for k in range(shards)]
        for k, name in enumerate(names):
            with tf.io.TFRecordWriter(name) as writer:
                for i in range(k, len(x), shards):  # round-robin: every shard gets each class
                    label = (tf.train.Feature(float_list=tf.train.FloatList(value=[y[i]]))
                             if args.regression else
                             tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])))
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "x": tf.train.Feature(bytes_list=tf.train.BytesList(
                            value=[np.ascontiguousarray(x[i], little_endian).tobytes()])),
                        "y": label}))
                    writer.write(example.SerializeToString())
        print("wrote %d %s examples in %d file(s)" % (len(x), part, shards))
    with open(os.path.join(args.out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote %s: --data_path %s" % (os.path.join(args.out_dir, "meta.json"), args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
