"""Deliberate errors in the update rules, and the tests that catch them.

Each mutation below changes one line of an example's train.py in place, runs the tests that
should notice, and puts the file back (also on an error or Ctrl-C). The output is a table:
the mutation and the tests that failed with it; a mutation no test catches is a gap in the
tests, and makes the script exit 1. pytest does not collect this file (it is not test_*.py).

    python tests/mutations.py              # every mutation (about 10 minutes on 2 cores)
    python tests/mutations.py dynsgd nesterov   # only those whose name contains a word
"""
import collections
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the tests that start run.sh take half a minute each: the op-by-op tests are the ones to run
END_TO_END = ("reaches or pushes_once or exchanges_once or killed or about_one_push_old or "
              "counts_the_pushes_of_others_between_a_pull or final_global_step or "
              "staleness_is_zero or chief_evaluates or centre_not_its_own_copy")
OP_BY_OP = "not (%s)" % END_TO_END
GC_OP_BY_OP = "not (default_run or without_a_worker)"  # Gradient-Compression's run.sh tests

Mutation = collections.namedtuple("Mutation", "name path old new tests select")

MUTATIONS = [
    Mutation("EASGD: alpha's sign flipped (the worker moves away from the centre)",
             "EASGD/train.py", "p.assign_sub(args.alpha * d, read_value=False)",
             "p.assign_sub(-args.alpha * d, read_value=False)", "tests/test_easgd.py", OP_BY_OP),
    Mutation("AEASGD: alpha's sign flipped", "AEASGD/train.py",
             "elastic = [args.alpha * (", "elastic = [-args.alpha * (",
             "tests/test_aeasgd.py", OP_BY_OP),
    Mutation("EAMSGD: alpha's sign flipped", "EAMSGD/train.py",
             "elastic = [args.alpha * (", "elastic = [-args.alpha * (",
             "tests/test_eamsgd.py", OP_BY_OP),
    Mutation("EASGD: beta = alpha instead of N * alpha", "EASGD/train.py",
             "GradientDescentOptimizer(args.alpha * n)", "GradientDescentOptimizer(args.alpha)",
             "tests/test_easgd.py", OP_BY_OP),
    Mutation("AEASGD: centre.assign(elastic) for assign_add", "AEASGD/train.py",
             "c.assign_add(e, read_value=False)", "c.assign(e, read_value=False)",
             "tests/test_aeasgd.py", OP_BY_OP),
    Mutation("AEASGD: centre.assign(centre + elastic), a read-modify-write", "AEASGD/train.py",
             "c.assign_add(e, read_value=False)", "c.assign(c.read_value() + e, read_value=False)",
             "tests/test_aeasgd.py", OP_BY_OP),
    Mutation("DynSGD: scale 1 / (s + 2)", "DynSGD/train.py",
             "scale = 1.0 / tf.cast(staleness + 1, tf.float32)",
             "scale = 1.0 / tf.cast(staleness + 2, tf.float32)", "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("DynSGD: a push without the lock", "DynSGD/train.py",
             "push = locked_on_the_ps(push_on_the_ps)", "push = push_on_the_ps()",
             "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("DynSGD: the pull stops copying the parameters", "DynSGD/train.py",
             "for copy in (local_params, pulled_params) for n in values])",
             "for copy in () for n in values])", "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("DynSGD: the critical section's ops on the worker (the lock held over the network)",
             "DynSGD/train.py", "with tf.compat.v1.device(ps):\n            return one_at_a_time",
             "with tf.compat.v1.device(worker):\n            return one_at_a_time",
             "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("DynSGD: the push reads the change from the worker, under the lock",
             "DynSGD/train.py", "theta.assign_add(scale * arrived[name], read_value=False)",
             "theta.assign_add(scale * change[name], read_value=False)",
             "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("DynSGD: staleness not clamped at 0", "DynSGD/train.py",
             "staleness = tf.maximum(clock - pulled_at[k], 0)", "staleness = clock - pulled_at[k]",
             "tests/test_dynsgd.py", OP_BY_OP),
    Mutation("Sparse-Embeddings: one seed for every slice of the embeddings",
             "Sparse-Embeddings/train.py", "seed=[seed, first_row]", "seed=[seed, 0]",
             "tests/test_sparse_embeddings.py", "own_draw"),
    Mutation("Sparse-Embeddings-TF2: a table slice's dense gradient applied, silently",
             "Sparse-Embeddings-TF2/train.py",
             "    if not isinstance(gradient, tf.IndexedSlices):\n        raise",
             "    if not isinstance(gradient, tf.IndexedSlices):\n        return tf.IndexedSlices("
             "rate * gradient, tf.range(tf.shape(gradient)[0]))\n        raise",
             "tests/test_sparse_embeddings.py", "tensorflow_2_a"),
    Mutation("Sparse-Embeddings-TF2: ids not hashed to rows (the first slice gets every user)",
             "Sparse-Embeddings-TF2/train.py", "return ids * 2654435761 % rows",
             "return ids % rows", "tests/test_sparse_embeddings.py", "tensorflow_2_a"),
    Mutation("Sparse-Embeddings-TF2: steps update the first 2 slices of a table only",
             "Sparse-Embeddings-TF2/train.py",
             'for v in getattr(p, "variables", [p])]\n',
             'for v in getattr(p, "variables", [p])[:2]]\n',
             "tests/test_sparse_embeddings.py", "tensorflow_2_slices"),
    Mutation("Distributed-Setup: a resumed chief initialises everything, restores only the step",
             "Distributed-Setup/train.py",
             "                self.saver.restore(session, checkpoint)\n",
             "                session.run(global_init)\n                self.global_step.load("
             "tf.train.load_variable(checkpoint, 'global_step'), session)\n",
             "tests/test_distributed_setup.py", "same_log_dir_resumes"),
    Mutation("Evolution-Strategies: a resumed chief initialises theta, restores only the step",
             "Evolution-Strategies/train.py",
             "                self.saver.restore(session, checkpoint)\n",
             "                session.run(global_init)\n                self.global_step.load("
             "tf.train.load_variable(checkpoint, 'global_step'), session)\n",
             "tests/test_evolution_strategies.py", "rerun_resumes"),
    Mutation("DOWNPOUR: pushes the mean of the gradients, not the sum", "DOWNPOUR/train.py",
             "[(a.read_value(), p) for a, p in", "[(a.read_value() / args.window, p) for a, p in",
             "tests/test_downpour.py", OP_BY_OP),
    Mutation("DOWNPOUR: push_and_pull pushes without pulling", "DOWNPOUR/train.py",
             "with tf.control_dependencies([copy_global_to_local()]):  # built after the push",
             "with tf.control_dependencies([]):  # built after the push",
             "tests/test_downpour.py", OP_BY_OP),
    Mutation("ParameterServerStrategy: every worker reads the first shard",
             "ParameterServerStrategy/train.py",
             "return training_dataset(data, args.batch_size, worker, workers, args.seed)",
             "return training_dataset(data, args.batch_size, 0, workers, args.seed)",
             "tests/test_parameter_server_strategy.py", "own_shard"),
    Mutation("ADAG: pushes the sum of the changes, not the mean", "ADAG/train.py",
             "(local_params[n] - pulled_params[n]) / args.window for n in start]",
             "(local_params[n] - pulled_params[n]) for n in start]", "tests/test_adag.py",
             OP_BY_OP),
    Mutation("Sync-SGD: learning rate without x N", "Sync-SGD/train.py",
             "GradientDescentOptimizer(args.learning_rate * replicas_to_aggregate)",
             "GradientDescentOptimizer(args.learning_rate)", "tests/test_sync_sgd.py",
             "n_times_the_learning_rate"),
    Mutation("MultiWorkerMirroredStrategy: learning rate without x N",
             "MultiWorkerMirroredStrategy/train.py",
             "learning_rate = args.learning_rate * strategy.num_replicas_in_sync",
             "learning_rate = args.learning_rate", "tests/test_multi_worker_mirrored_strategy.py",
             "n_times_the_learning_rate"),
    Mutation("DiLoCo: outer gradient with the wrong sign", "DiLoCo/train.py",
             "outer_gradients = [start[n] - p for", "outer_gradients = [p - start[n] for",
             "tests/test_diloco.py", OP_BY_OP),
    Mutation("DiLoCo: Nesterov off (plain momentum on the ps)", "DiLoCo/train.py",
             "use_nesterov=True", "use_nesterov=False", "tests/test_diloco.py", OP_BY_OP),
    Mutation("EAMSGD: Nesterov off (gradient at the parameters, no look-ahead)", "EAMSGD/train.py",
             "ahead = {name: p + args.momentum * velocity[name]",
             "ahead = {name: p + 0 * velocity[name]", "tests/test_eamsgd.py", OP_BY_OP),
    Mutation("Hogwild: the clock read at the pull not ordered before the parameters",
             "Hogwild/train.py", "with tf.control_dependencies([pulled_at]):",
             "with tf.control_dependencies([]):", "tests/test_hogwild.py", "reads_the_clock"),
    Mutation("AEASGD: the chief evaluates its local copy, not the centre", "AEASGD/train.py",
             "model_metrics(aeasgd.centre, x, y)", "model_metrics(aeasgd.local_params, x, y)", "tests/test_aeasgd.py", "centre_not_its_own_copy"),
    Mutation("EAMSGD: the chief evaluates its local copy, not the centre", "EAMSGD/train.py",
             "model_metrics(eamsgd.centre, x, y)", "model_metrics(eamsgd.local_params, x, y)", "tests/test_eamsgd.py", "centre_not_its_own_copy"),
    Mutation("EASGD: the chief evaluates its local copy, not the centre", "EASGD/train.py",
             "model_metrics(easgd.centre, x, y)", "model_metrics(easgd.local_params, x, y)", "tests/test_easgd.py", "centre_not_its_own_copy"),
    Mutation("In-Graph-Replication: every tower fed the whole mini-batch",
             "In-Graph-Replication/train.py",
             "loss = model_loss(params, x_slices[i], y_slices[i])",
             "loss = model_loss(params, x, y)",
             "tests/test_in_graph_replication.py", "slice or whole_batch"),
    Mutation("In-Graph-Replication: the towers' gradients summed, not averaged",
             "In-Graph-Replication/train.py", "[tf.add_n(list(g)) / len(devices) for g",
             "[tf.add_n(list(g)) for g", "tests/test_in_graph_replication.py",
             "slice or whole_batch"),
    Mutation("Model-Parallel-Pipeline: a stage may get no layer",
             "Model-Parallel-Pipeline/train.py",
             "for count in range(1, len(weights) - first - stages + 2):",
             "for count in range(0, len(weights) - first - stages + 2):",
             "tests/test_model_parallel_pipeline.py", "run_of_whole_layers"),
    Mutation("Model-Parallel-Pipeline: a GPU's kernels (its streams) not counted as busy",
             "Model-Parallel-Pipeline/train.py", '.replace("/replica:0", "").split("/stream:")[0]',
             '.replace("/replica:0", "")', "tests/test_model_parallel_pipeline.py",
             "gpu_streams"),
    Mutation("Model-Parallel-Pipeline: waiting for a tensor counted as busy",
             "Model-Parallel-Pipeline/train.py", 'if stages and op.node_name != "RecvTensor":',
             "if stages:", "tests/test_model_parallel_pipeline.py", "gpu_streams"),
    Mutation("Model-Parallel-Pipeline: the micro-batches' gradients summed, not averaged",
             "Model-Parallel-Pipeline/train.py", "tf.add_n(list(g)) / micro_batches)",
             "tf.add_n(list(g)))", "tests/test_model_parallel_pipeline.py", "same_update"),
    Mutation("Model-Parallel-Pipeline: a stage waits for the last stage (no pipeline)",
             "Model-Parallel-Pipeline/train.py", "[last_output[stage]] if m else []",
             "[last_output[-1]] if m else []", "tests/test_model_parallel_pipeline.py",
             "waits_for or works_on_a_micro_batch"),
    Mutation("Gradient-Compression: error feedback off where it is claimed on (no residual kept)",
             "Gradient-Compression/train.py",
             "if error_feedback:  # keep what the message missed",
             "if False:  # keep what the message missed", "tests/test_gradient_compression.py",
             GC_OP_BY_OP),
    Mutation("Gradient-Compression: the residual's sign flipped", "Gradient-Compression/train.py",
             "residuals[n].assign(p[n] - sent[n], read_value=False)",
             "residuals[n].assign(sent[n] - p[n], read_value=False)",
             "tests/test_gradient_compression.py", GC_OP_BY_OP),
    Mutation("Gradient-Compression: QSGD's scale (the norm) dropped", "Gradient-Compression/train.py",
             "return norm * tf.cast(levels, tf.float32) / self.args.levels",
             "return tf.cast(levels, tf.float32) / self.args.levels",
             "tests/test_gradient_compression.py", GC_OP_BY_OP),
    Mutation("Gradient-Compression: the step counted before the ps applies it",
             "Gradient-Compression/train.py",
             "with tf.control_dependencies(applied):  # not before",
             "with tf.control_dependencies([]):  # not before",
             "tests/test_gradient_compression.py", GC_OP_BY_OP),
]


def failing_tests(mutation):
    """Apply the mutation, run its tests, put the file back; the names of the tests that failed."""
    path = os.path.join(ROOT, mutation.path)
    with open(path) as f:
        original = f.read()
    if original.count(mutation.old) != 1:
        sys.exit("%s: the line to change is not in %s exactly once: update MUTATIONS"
                 % (mutation.name, mutation.path))
    try:
        with open(path, "w") as f:
            f.write(original.replace(mutation.old, mutation.new))
        run = subprocess.run([sys.executable, "-m", "pytest", mutation.tests, "-q",
                              "-p", "no:cacheprovider", "-k", mutation.select],
                             cwd=ROOT, capture_output=True, text=True, timeout=1200)
    finally:
        with open(path, "w") as f:
            f.write(original)
    failed = re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", run.stdout, re.M)
    if not failed and run.returncode not in (0, 1):  # no test ran, or pytest itself failed
        failed = ["(pytest exit %d: %s)" % (run.returncode, run.stdout.strip().splitlines()[-1])]
    return failed


def main(words):
    chosen = [m for m in MUTATIONS if not words or any(w.lower() in m.name.lower() for w in words)]
    rows, survived = [], []
    for mutation in chosen:
        started = time.time()
        failed = failing_tests(mutation)
        print("%-66s %4.0f s  %s" % (mutation.name[:66], time.time() - started,
                                     ", ".join(failed) or "SURVIVED"), flush=True)
        rows.append((mutation.name, failed))
        if not failed:
            survived.append(mutation.name)
    print("\n| mutation | failing tests |\n|---|---|")
    for name, failed in rows:
        print("| %s | %s |" % (name, "<br>".join(failed) or "**none: survived**"))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
