"""Deliberate errors in the update rules, and the tests that catch them.

Each mutation below changes one line of an example's train.py in place, runs the tests that
should notice, and puts the file back (also on an error or Ctrl-C). The output is a table:
the mutation and the tests that failed with it; a mutation no test catches is a gap in the
tests, and makes the script exit 1. A mutation names its tests by file, running the file's
tests marked `rule` (an algorithm's update rule, op by op: seconds), or by pytest node id.
Do not commit while it runs: the train.py it mutates is changed on disk.

    python tools/mutations.py              # every mutation (about 20 minutes on 2 cores)
    python tools/mutations.py dynsgd nesterov   # only those whose name contains a word
"""
import collections
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULE = "rule"  # the marker of the tests of an algorithm's update rule: a file's tests so marked
# tests: a test file, or a tuple of node ids; select: a marker that picks the file's tests, or None
Mutation = collections.namedtuple("Mutation", "name path old new tests select")


def node(path, *tests):
    """Node ids of tests in the file at path (a test's name alone: all its parameters)."""
    return tuple("%s::%s" % (path, test) for test in tests)


# the chief's restore at a resume, as the appendix of Distributed-Setup and Evolution-Strategies
# writes it, and a restore of the global step alone over freshly initialised variables
RESTORE = "            saver.restore(session, checkpoint) if checkpoint else session.run(init)\n"
RESTORE_ONLY_THE_STEP = ("            session.run(init)\n            if checkpoint:\n"
                         "                self.global_step.load("
                         "tf.train.load_variable(checkpoint, 'global_step'), session)\n")
ELASTIC = "tests/test_examples_end_to_end.py::test_the_chief_evaluates_the_centre_not_its_own_copy"
# EAMSGD's rule tests, and the exchange test it shares with AEASGD
EAMSGD_RULE = ("tests/test_eamsgd.py", "tests/test_aeasgd.py::test_two_workers_exchanges_both_land_"
               "and_the_second_sees_the_first[EAMSGD]")
TEST_METRICS = node("tests/test_plumbing.py",
                    "test_the_test_metrics_are_means_over_every_example_each_batch_weighed_by_its_"
                    "size")
TF2_SPARSE_STEP = node("tests/test_sparse_embeddings.py",
                       "test_tensorflow_2_a_step_changes_only_the_rows_looked_up_in_both_slices",
                       "test_tensorflow_2_a_table_slice_with_a_dense_gradient_fails_loudly")
TOWERS = node("tests/test_in_graph_replication.py",
              "test_each_tower_gets_its_own_slice_and_the_mean_gradient_is_the_whole_batchs",
              "test_one_update_moves_the_parameters_by_the_whole_batchs_gradient")
BUSY_TIME = node("tests/test_model_parallel_pipeline.py",
                 "test_a_stages_busy_time_is_its_devices_work_gpu_streams_included_never_its_waits")
PIPELINE = "tests/test_model_parallel_pipeline.py"
ONE_CLIENT = "tests/test_in_graph_replication.py"  # the plumbing of one client is tested there
RESTARTED_CLIENT = node(ONE_CLIENT, "test_a_restarted_client_finds_its_workers_serving_and_ends_"
                        "them_at_the_end")
# the SIGTERM run of MultiWorkerMirroredStrategy, SIGTERM to worker 1 and again after the resume
MWMS_SIGTERM = node("tests/test_multi_worker_mirrored_strategy.py", "test_a_sigterm_saves_a_"
                    "checkpoint_at_one_step_on_every_worker_and_the_rerun_resumes_there[worker1]")

PSS_TESTS = "tests/test_parameter_server_strategy.py"
MWMS_TESTS = "tests/test_multi_worker_mirrored_strategy.py"
KERAS_TESTS = "tests/test_keras_fit.py"
KERAS_RESUMED = node(KERAS_TESTS, "test_a_run_stopped_at_its_steps_mid_epoch_resumes_and_ends_at_"
                     "exactly_the_new_steps")
# the shuffle seed of ParameterServerStrategy's (and Sparse-Embeddings-TF2's) dataset function
TF2_SEED = "        seed = (args.seed * 1000 + tf.cast(worker, tf.int64)) * 1000003"

DATA_FILES = "tests/test_data_files.py"
OWN_MODEL = "tests/test_own_data_and_model.py"
CONVERT = "tools/npz_to_tfrecord.py"
CONVERTER_REFUSES = node(DATA_FILES, "test_the_converter_refuses_what_the_npz_path_refuses_in_one_"
                         "line")
TRACED_ARRAYS = node(DATA_FILES, "test_a_traced_dataset_function_holds_pixels_as_bytes_and_"
                     "refuses_arrays_over_its_limit")
KERAS_REFUSED = node(OWN_MODEL, "test_a_keras_model_that_acts_otherwise_in_training_is_refused_in_"
                     "one_line")
KERAS_BY_NAME = node(OWN_MODEL, "test_keras_logits_takes_each_weight_by_its_name_and_checks_its_"
                     "shape")
ES_TESTS = "tests/test_evolution_strategies.py"
MUTATIONS = [
    Mutation("TFRecord files: every worker reads every training file", "Distributed-Setup/train.py",
             "from_tensor_slices(data.train_files).shard(num_workers, worker_index)",
             "from_tensor_slices(data.train_files)",
             node(DATA_FILES, "test_each_worker_reads_only_its_own_files_and_together_they_read_"
                  "every_example"), None),
    Mutation("An .npz: every worker trains on the whole set", "Distributed-Setup/train.py",
             "shard = (x[worker_index::num_workers], y[worker_index::num_workers])",
             "shard = (x, y)",
             node(DATA_FILES, "test_an_npz_reaches_each_worker_as_its_own_shard_and_never_as_a_"
                  "constant_of_the_graph"), None),
    Mutation("ParameterServerStrategy's traced dataset function: arrays of any size a constant",
             "ParameterServerStrategy/train.py",
             "if not tf.executing_eagerly() and size > ARRAYS_IN_A_GRAPH_MB:",
             "if False:", TRACED_ARRAYS, None),
    Mutation("ParameterServerStrategy's traced dataset function: pixels a constant in float32",
             "ParameterServerStrategy/train.py",
             "examples = tf.data.Dataset.from_tensor_slices((x, y))",
             "examples = tf.data.Dataset.from_tensor_slices((x.astype(np.float32) / scale, y))",
             TRACED_ARRAYS, None),
    Mutation("npz_to_tfrecord: a folder with an older set's shards written into",
             CONVERT, "    if older:  # the reader", "    if False:  # the reader",
             node(DATA_FILES, "test_the_converter_refuses_a_folder_that_holds_a_data_set_already_"
                  "and_leaves_it_as_it_was"), None),
    Mutation("npz_to_tfrecord: 8 shards by default (3 and 6 workers get unequal files)", CONVERT,
             "default=24,", "default=8,", node(DATA_FILES, "test_the_converters_default_shards_"
                                               "divide_evenly_over_1_2_3_4_6_and_8_workers"), None),
    Mutation("npz_to_tfrecord: NaN and infinite values written", CONVERT,
             'if array.dtype.kind == "f" and not all(', "if False and not all(",
             CONVERTER_REFUSES, None),
    Mutation("npz_to_tfrecord: x_test written in its dtype under x_train's in meta.json", CONVERT,
             'if arrays["x_test"].dtype.name != x_train.dtype.name:', "if False:",
             CONVERTER_REFUSES, None),
    Mutation("npz_to_tfrecord: bytes written in the array's byte order (decode_raw: little)",
             CONVERT, "np.ascontiguousarray(x[i], little_endian)", "np.ascontiguousarray(x[i])",
             node(DATA_FILES, "test_big_endian_arrays_are_written_little_endian_as_the_reader_"
                  "decodes_them"), None),
    Mutation("step-time model: held-out runs its rule saw before it was committed counted",
             "benchmarks/step_time_model.py", "kept = [r for r in runs if not seen or not (",
             "kept = [r for r in runs if True or not (",
             node("tests/test_compare.py", "test_the_step_time_model_leaves_out_the_held_out_runs_"
                  "its_rule_saw_and_says_so"), None),
    Mutation("step-time model: a held-out file without one-process runs ends in a traceback",
             "benchmarks/step_time_model.py", "    if not one_host:\n", "    if False:\n",
             node("tests/test_compare.py", "test_the_step_time_model_given_a_held_out_file_"
                  "without_one_process_runs_stops_in_one_line"), None),
    Mutation("sync_shared: every folder with a train.py taken for an example (a user's copy too)",
             "tools/sync_shared.py", "    examples = sorted(EXAMPLES)\n",
             '    examples = sorted(d for d in os.listdir(ROOT) if os.path.isfile(os.path.join('
             'ROOT, d, "train.py")))\n',
             node("tests/test_boilerplate.py", "test_a_folder_copied_inside_the_repository_keeps_"
                  "its_own_model_when_the_shared_text_is_synced"), None),
    Mutation("docs/own-model.md: the Keras recipe imports tf_keras at the top of train.py",
             "docs/own-model.md", "```python\ndef model_params(input_shape, hidden, seed, num_",
             "```python\nimport tf_keras\n\n\ndef model_params(input_shape, hidden, seed, num_",
             node(OWN_MODEL, "test_docs_keras_recipe_trains_a_copy_on_the_digits_saved_as_images_"
                  "offline"), None),
    Mutation("TFRecord test files: the last, smaller batch dropped", "Distributed-Setup/train.py",
             ".batch(size).map(parse_records(self))",
             ".batch(size, drop_remainder=True).map(parse_records(self))",
             node(DATA_FILES, "test_the_test_files_stream_in_batches_of_the_size_asked_holding_"
                  "the_whole_test_set"), None),
    Mutation("An .npz's integer pixels reach the model unscaled", "Distributed-Setup/train.py",
             "examples.map(lambda xs, ys: (tf.cast(xs, tf.float32) / scale, ys))",
             "examples.map(lambda xs, ys: (tf.cast(xs, tf.float32), ys))",
             node(DATA_FILES, "test_integer_pixels_reach_the_model_scaled_by_the_training_sets_"
                  "largest_value"), None),
    Mutation("The chief's test set from an .npz: integer pixels unscaled",
             "Distributed-Setup/train.py", "x = tf.cast(xs, tf.float32) / scale if scale and",
             "x = tf.cast(xs, tf.float32) if scale and",
             node(DATA_FILES, "test_the_test_sets_integer_pixels_reach_the_chiefs_metrics_scaled_"
                  "as_in_training"), None),
    Mutation("The classes counted in the training labels alone", "Distributed-Setup/train.py",
             "num_classes = int(max(y_train.max(), y_test.max())) + 1",
             "num_classes = int(y_train.max()) + 1",
             node(DATA_FILES, "test_the_number_of_classes_counts_the_test_sets_labels_too"), None),
    Mutation("An .npz shard in the same order every epoch", "Distributed-Setup/train.py",
             "examples = examples.shuffle(len(x) // num_workers + 1, seed=seed)",
             "examples = examples.shuffle(len(x) // num_workers + 1, seed=seed,\n"
             "                            reshuffle_each_iteration=False)",
             node(DATA_FILES, "test_each_workers_shard_of_an_npz_comes_in_a_new_order_every_"
                  "epoch_and_every_session"), None),
    Mutation("Every worker draws its shard in the same order", "Distributed-Setup/train.py",
             "dataset((seed * 1000 + worker_index) * 1000003 + start_step))",
             "dataset(seed * 1000003 + start_step))",
             node(DATA_FILES, "test_each_workers_shard_of_an_npz_comes_in_a_new_order_every_"
                  "epoch_and_every_session"), None),
    Mutation("A new session replays the mini-batches the run began with",
             "Distributed-Setup/train.py",
             "start_the_data(session, self.step)",
             "start_the_data(session, 0)",
             node(DATA_FILES, "test_a_restarted_chief_does_not_replay_the_mini_batches_the_run_"
                  "began_with"), None),
    Mutation("Keras (docs/own-model.md's adapter): a Dropout layer taken, and run as at test",
             "docs/own-model.md", 'getattr(layer, rate, 0) for rate in ("rate", "dropout"',
             'getattr(layer, rate, 0) for rate in ("dropout"', KERAS_REFUSED, None),
    Mutation("Keras (docs/own-model.md's adapter): weights not trained by gradients handed out to train",
             "docs/own-model.md", "        if layer.non_trainable_weights and not list(",
             "        if False and not list(", KERAS_REFUSED, None),
    Mutation("Keras (docs/own-model.md's adapter): a regulariser's losses left out of the loss, silently",
             "docs/own-model.md", "    if model.losses:\n", "    if False:\n", KERAS_REFUSED,
             None),
    Mutation("Keras (docs/own-model.md's adapter): a copy takes the dict's weights by their place",
             "docs/own-model.md", "        return params[found[0]]\n",
             "        return list(params.values())[len(taken) - 1]\n", KERAS_BY_NAME, None),
    Mutation("Keras (docs/own-model.md's adapter): a copy takes a weight of another shape",
             "docs/own-model.md",
             "        if not shape.is_compatible_with(params[found[0]].shape):", "        if False:",
             KERAS_BY_NAME, None),
    Mutation("EASGD: alpha's sign flipped (the worker moves away from the centre)",
             "EASGD/train.py", "p.assign_sub(args.alpha * d, read_value=False)",
             "p.assign_sub(-args.alpha * d, read_value=False)", "tests/test_easgd.py", RULE),
    Mutation("AEASGD: alpha's sign flipped", "AEASGD/train.py",
             "elastic = [args.alpha * (", "elastic = [-args.alpha * (",
             "tests/test_aeasgd.py", RULE),
    Mutation("EAMSGD: alpha's sign flipped", "EAMSGD/train.py",
             "elastic = [args.alpha * (", "elastic = [-args.alpha * (",
             EAMSGD_RULE, RULE),
    Mutation("EASGD: beta = alpha instead of N * alpha", "EASGD/train.py",
             "GradientDescentOptimizer(args.alpha * n)", "GradientDescentOptimizer(args.alpha)",
             "tests/test_easgd.py", RULE),
    Mutation("AEASGD: centre.assign(elastic) for assign_add", "AEASGD/train.py",
             "c.assign_add(e, read_value=False)", "c.assign(e, read_value=False)",
             "tests/test_aeasgd.py", RULE),
    Mutation("AEASGD: centre.assign(centre + elastic), a read-modify-write", "AEASGD/train.py",
             "c.assign_add(e, read_value=False)", "c.assign(c.read_value() + e, read_value=False)",
             "tests/test_aeasgd.py", RULE),
    Mutation("DynSGD: scale 1 / (s + 2)", "DynSGD/train.py",
             "scale = 1.0 / tf.cast(staleness + 1, tf.float32)",
             "scale = 1.0 / tf.cast(staleness + 2, tf.float32)", "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: a push without the lock", "DynSGD/train.py",
             "push = locked_on_the_ps(push_on_the_ps)", "push = push_on_the_ps()",
             "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: the pull stops copying the parameters", "DynSGD/train.py",
             "for copy in (local_params, pulled_params) for n in values],",
             "for copy in () for n in values],", "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: the critical section's ops on the worker (the lock held over the network)",
             "DynSGD/train.py", "with tf.compat.v1.device(ps):\n            return one_at_a_time",
             "with tf.compat.v1.device(worker):\n            return one_at_a_time",
             "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: the push reads the change from the worker, under the lock",
             "DynSGD/train.py", "theta.assign_add(scale * arrived[name], read_value=False)",
             "theta.assign_add(scale * change[name], read_value=False)",
             "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: a push run again after a lost session's pull moves the clock",
             "DynSGD/train.py", "ticks = tf.cast(trained_now, tf.int64)",
             "ticks = tf.constant(1, tf.int64)", "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: the pull leaves 'trained' set (a push without training counted)",
             "DynSGD/train.py", "trained.assign(False, read_value=False))",
             "trained.assign(True, read_value=False))", "tests/test_dynsgd.py", RULE),
    Mutation("DynSGD: staleness not clamped at 0", "DynSGD/train.py",
             "staleness = tf.maximum(clock - pulled_at[k], 0)", "staleness = clock - pulled_at[k]",
             "tests/test_dynsgd.py", RULE),
    Mutation("Sparse-Embeddings: one seed for every slice of the embeddings",
             "Sparse-Embeddings/train.py", "seed=[seed, first_row]", "seed=[seed, 0]",
             node("tests/test_sparse_embeddings.py",
                  "test_every_slice_of_the_embeddings_starts_from_its_own_draw"), None),
    Mutation("Sparse-Embeddings-TF2: a table slice's dense gradient applied, silently",
             "Sparse-Embeddings-TF2/train.py",
             "    if not isinstance(gradient, tf.IndexedSlices):\n        raise",
             "    if not isinstance(gradient, tf.IndexedSlices):\n        return tf.IndexedSlices("
             "rate * gradient, tf.range(tf.shape(gradient)[0]))\n        raise",
             TF2_SPARSE_STEP, None),
    Mutation("Sparse-Embeddings-TF2: ids not hashed to rows (the first slice gets every user)",
             "Sparse-Embeddings-TF2/train.py", "return ids * 2654435761 % rows",
             "return ids % rows", TF2_SPARSE_STEP, None),
    Mutation("Sparse-Embeddings-TF2: steps update the first 2 slices of a table only",
             "Sparse-Embeddings-TF2/train.py",
             'for v in getattr(p, "variables", [p])]\n',
             'for v in getattr(p, "variables", [p])[:2]]\n',
             node("tests/test_sparse_embeddings.py",
                  "test_tensorflow_2_slices_each_table_over_the_ps_and_resumes_into_another_count"),
             None),
    Mutation("Distributed-Setup: a resumed chief initialises everything, restores only the step",
             "Distributed-Setup/train.py",
             RESTORE, RESTORE_ONLY_THE_STEP,
             node("tests/test_distributed_setup.py",
                  "test_a_rerun_with_the_same_log_dir_resumes_from_the_checkpoint"), None),
    Mutation("Distributed-Setup (the appendix): the chief's prepare_session given the "
             "checkpoint_dir, TensorFlow's default (a restarted chief rolls a live ps back)",
             "Distributed-Setup/train.py",
             "session = manager.prepare_session(self.server.target, config=config,",
             "session = manager.prepare_session(self.server.target, config=config, "
             "saver=self.saver, checkpoint_dir=args.log_dir,",
             node("tests/test_distributed_setup.py", "test_a_restarted_chief_resumes_at_the_ps_"
                  "global_step_where_tensorflow_would_roll_back"), None),
    Mutation("Distributed-Setup (the appendix): the run starts only if its first session "
             "came up (a first session lost to a restart leaves the clock unset)",
             "Distributed-Setup/train.py", "        if self.start_step is None:",
             "        if self.sessions == 1:",
             node("tests/test_distributed_setup.py", "test_a_first_session_lost_to_a_restart_"
                  "still_starts_the_clock_and_ends_the_run"), None),
    Mutation("Distributed-Setup (the appendix): the watchdog counts the wait for a lost ps",
             "Distributed-Setup/train.py",
             "limit = self.args.connect_timeout if self.ps_lost else self.args.watchdog",
             "limit = self.args.watchdog",
             node("tests/test_plumbing.py", "test_the_watchdog_leaves_alone_a_worker_that_waits_"
                  "for_its_ps_to_come_back"), None),
    Mutation("Distributed-Setup (the appendix): a step retried in a session that finds the run "
             "over runs again (MonitoredSession's default)", "Distributed-Setup/train.py",
             "        if self.over:\n            raise tf.errors.OutOfRangeError",
             "        if False:\n            raise tf.errors.OutOfRangeError",
             node("tests/test_distributed_setup.py", "test_an_update_retried_in_a_new_session_"
                  "that_finds_the_run_over_is_not_run_again"), None),
    Mutation("Distributed-Setup (the appendix): one ps of several restarted, every ps restored "
             "(the live ones rolled back)", "Distributed-Setup/train.py",
             "        for ps, saver, init in lost:",
             "        for ps, saver, init in lost and [(p, s, i) for p, _, s, i in self.by_ps]:",
             node("tests/test_distributed_setup.py", "test_with_two_ps_a_ps_that_lost_its_"
                  "variables_gets_them_back_and_the_other_keeps_its_own"), None),
    Mutation("TFRecord files: a worker's files and records in the same order every epoch",
             "Distributed-Setup/train.py",
             "files.shuffle(len(data.train_files), seed=seed).interleave(\n"
             "        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)\n"
             "    records = records.shuffle(10000, seed=seed)",
             "files.shuffle(len(data.train_files), seed=seed, reshuffle_each_iteration=False"
             ").interleave(\n"
             "        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)\n"
             "    records = records.shuffle(10000, seed=seed, reshuffle_each_iteration=False)",
             node(DATA_FILES, "test_every_epoch_of_a_workers_tfrecord_files_comes_in_a_new_"
                  "order"), None),
    Mutation("DOWNPOUR (the appendix): the workers check for the chief every 30 s, "
             "WorkerSessionCreator's default", "DOWNPOUR/train.py",
             "recovery_wait_secs=1)", "recovery_wait_secs=30)",
             node("tests/test_downpour.py", "test_downpour_workers_start_from_the_ps_values_"
                  "through_the_session_barrier"), None),
    Mutation("Evolution-Strategies: a resumed chief initialises theta, restores only the step",
             "Evolution-Strategies/train.py",
             RESTORE, RESTORE_ONLY_THE_STEP,
             node("tests/test_evolution_strategies.py",
                  "test_a_rerun_resumes_from_the_chiefs_checkpoint_with_every_copy_alike"), None),
    Mutation("Evolution-Strategies: a restarted chief taken back (its checkpoint is older than "
             "the workers' copies)", "Evolution-Strategies/train.py",
             "        if args.task_index == 0 and worker.rejoining:",
             "        if False:",
             node(ES_TESTS, "test_a_restarted_chief_is_refused_in_one_line"), None),
    Mutation("Evolution-Strategies: a worker takes the first copy handed over, whoever asked",
             "Evolution-Strategies/train.py", "    while taken not in (ticket, LAST_COPY):\n",
             "    while taken is None:\n", ES_TESTS, RULE),
    Mutation("Evolution-Strategies: no spare list for a lost process's step still on the ps",
             "Evolution-Strategies/train.py", "with tf.control_dependencies([spare]):",
             "with tf.control_dependencies([]):", ES_TESTS, RULE),
    Mutation("Evolution-Strategies: a copy handed over leaves the older lists in the queue",
             "Evolution-Strategies/train.py", "    with tf.control_dependencies(emptied):\n",
             "    with tf.control_dependencies([spare]):\n",
             node(ES_TESTS, "test_a_worker_that_starts_late_takes_the_chiefs_copy_of_now_and_no_"
                  "older_list"), None),
    Mutation("Evolution-Strategies: the chief leaves no copy at its end (a rerun with no "
             "generation left waits for one)", "Evolution-Strategies/train.py",
             "        session.run(es.leave_last_copy)\n", "        pass\n",
             node(ES_TESTS, "test_a_rerun_resumes_from_the_chiefs_checkpoint_with_every_copy_"
                  "alike"), None),
    Mutation("Evolution-Strategies: a copy handed over without Adam's moments",
             "Evolution-Strategies/train.py",
             "copy.update((v.op.name, v) for v in adam.variables())",
             "copy.update((v.op.name, v) for v in [])", ES_TESTS, RULE),
    Mutation("Evolution-Strategies: the chief's Adam moments left out of its checkpoint",
             "Evolution-Strategies/train.py",
             "        if k > 0:\n            move_to_local_variables(adam.variables())",
             "        if True:\n            move_to_local_variables(adam.variables())",
             node(ES_TESTS, "test_a_resumed_run_goes_on_with_adams_moments_bit_for_bit"), None),
    Mutation("Evolution-Strategies: pairs generations old make the chief wait for that worker",
             "Evolution-Strategies/train.py", "return {k} if g >= generation - 1 else set()",
             "return {k}",
             node(ES_TESTS, "test_a_worker_generations_behind_is_not_waited_for_until_its_pairs_"
                  "are_current"), None),
    Mutation("Distributed-Setup (the appendix): the test metrics' last, uneven batch weighed "
             "as 1000 examples", "Distributed-Setup/train.py",
             "totals.update({name: value * size for", "totals.update({name: value * 1000 for",
             TEST_METRICS, None),
    Mutation("Distributed-Setup (the appendix): the test metrics, a mean of the batches' means",
             "Distributed-Setup/train.py",
             "{name: value * size for name, value in metrics.items()})\n        examples += size",
             "{name: value for name, value in metrics.items()})\n        examples += 1",
             TEST_METRICS, None),
    Mutation("DOWNPOUR: pushes the mean of the gradients, not the sum", "DOWNPOUR/train.py",
             "[(a.read_value(), p) for a, p in", "[(a.read_value() / args.window, p) for a, p in",
             "tests/test_downpour.py", RULE),
    Mutation("DOWNPOUR: push_and_pull pushes without pulling", "DOWNPOUR/train.py",
             "with tf.control_dependencies([copy_global_to_local()]):  # built after the push",
             "with tf.control_dependencies([]):  # built after the push",
             "tests/test_downpour.py", RULE),
    Mutation("ParameterServerStrategy: every worker reads the first shard",
             "ParameterServerStrategy/train.py",
             "return training_dataset(data, args.batch_size, worker, workers, seed)",
             "return training_dataset(data, args.batch_size, 0, workers, seed)",
             node(PSS_TESTS, "test_each_worker_reads_its_own_shard_and_no_example_is_read_by_both"),
             None),
    Mutation("ParameterServerStrategy: a step moves up the gradient",
             "ParameterServerStrategy/train.py",
             "v.assign_sub(args.learning_rate * strategy.reduce(",
             "v.assign_add(args.learning_rate * strategy.reduce(", PSS_TESTS, RULE),
    Mutation("ParameterServerStrategy: a resumed run, or a restarted worker, replays its shard",
             "ParameterServerStrategy/train.py", TF2_SEED + " + global_step\n", TF2_SEED + "\n",
             node(PSS_TESTS, "test_a_resumed_run_or_a_restarted_worker_reads_its_shard_in_an_order_"
                  "of_its_own"), None),
    Mutation("ParameterServerStrategy: a coordinator waits without bound for a cluster to start",
             "ParameterServerStrategy/train.py", "    with bounded_start(args, cluster):",
             "    with contextlib.nullcontext():",
             node(PSS_TESTS, "test_a_coordinator_whose_cluster_never_starts_names_the_silent_tasks_"
                  "in_one_line"), None),
    Mutation("ParameterServerStrategy: a server takes an unanswered coordinator for gone at once",
             "ParameterServerStrategy/train.py",
             "        except OSError:  # no answer within the second, or no route for now\n"
             "            pass\n",
             "        except OSError:  # no answer within the second, or no route for now\n"
             "            break\n",
             node(PSS_TESTS, "test_a_server_takes_a_refused_coordinator_for_gone_at_once_and_an_"
                  "unanswered_one_later"), None),
    Mutation("ParameterServerStrategy: a port in use ends in a cause, not in what to do",
             "ParameterServerStrategy/train.py",
             'if "Could not start gRPC server" in e.message:', "if False:",
             node(PSS_TESTS, "test_a_port_already_in_use_is_one_line"), None),
    Mutation("ParameterServerStrategy: no loss in TensorBoard",
             "ParameterServerStrategy/train.py", '+ ([("loss", loss)] if loss is not None else [])',
             "+ []", node(PSS_TESTS, "test_the_coordinator_schedules_every_step_on_one_of_the_two_"
                          "workers"), None),
    Mutation("Sparse-Embeddings-TF2: a resumed run replays the pairs in the first run's order",
             "Sparse-Embeddings-TF2/train.py", TF2_SEED + " + global_step\n", TF2_SEED + "\n",
             node("tests/test_sparse_embeddings.py", "test_tensorflow_2_a_resumed_run_reads_the_"
                  "pairs_in_an_order_of_its_own"), None),
    Mutation("MultiWorkerMirroredStrategy: a resumed run replays its shard",
             "MultiWorkerMirroredStrategy/train.py", " * 1000003 + int(global_step.numpy())",
             " * 1000003", node(MWMS_TESTS, "test_a_resumed_run_reads_its_shard_in_an_order_of_its_"
                                "own"), None),
    Mutation("MultiWorkerMirroredStrategy: a worker waits without bound for a chief never started",
             "MultiWorkerMirroredStrategy/train.py",
             "    if args.task_index and not wait_for(", "    if False and not wait_for(",
             node(MWMS_TESTS, "test_a_worker_whose_chief_never_comes_ends_in_one_line_that_names_"
                  "it"), None),
    Mutation("Keras-Fit: a resumed fit replays its shard", "Keras-Fit/train.py",
             " * 1000003 + model.optimizer.iterations", " * 1000003",
             node(KERAS_TESTS, "test_a_resumed_fit_reads_its_shard_in_an_order_of_its_own"), None),
    Mutation("Keras-Fit: a rerun resumes at the epoch after the one backed up",
             "Keras-Fit/train.py",
             '            self._training_state._ckpt_saved_epoch.assign(-1)  # "none backed up yet"',
             "            pass", KERAS_RESUMED, None),
    Mutation("Keras-Fit: the steps to --steps counted from 0, not from the global step restored",
             "Keras-Fit/train.py",
             "            self.reached = run.start_step  # the steps scheduled:",
             "            self.reached = 0  # the steps scheduled:", KERAS_RESUMED, None),
    Mutation("Keras-Fit: the backup restored only in fit (after the datasets are made)",
             "Keras-Fit/train.py", "    restore_the_backup(args, backup, fit.model)\n", "",
             KERAS_RESUMED, None),
    Mutation("Keras-Fit: no mini-batches counted by worker (ParameterServerStrategy)",
             "Keras-Fit/train.py", "    model.train_step = counted\n", "",
             node(KERAS_TESTS, "test_the_parameter_server_run_saves_a_model_that_loads_in_a_fresh_"
                  "process_with_its_accuracy"), None),
    Mutation("ADAG: pushes the sum of the changes, not the mean", "ADAG/train.py",
             "(local_params[n] - pulled_params[n]) / args.window for n in start]",
             "(local_params[n] - pulled_params[n]) for n in start]", "tests/test_adag.py",
             RULE),
    Mutation("Sync-SGD: learning rate without x N", "Sync-SGD/train.py",
             "GradientDescentOptimizer(args.learning_rate * replicas_to_aggregate)",
             "GradientDescentOptimizer(args.learning_rate)", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a restarted chief keeps the round its predecessor left half done",
             "Sync-SGD/train.py", "            self.drop_the_round(session)\n",
             "            pass\n", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a restarted chief leaves the dropped round's gradients in",
             "Sync-SGD/train.py",
             "if session.run(count) == 0 or self.at_once(session, empty, self.try_seconds):",
             "if True:", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: the dropped round's emptying tried once (a take cancelled late)",
             "Sync-SGD/train.py", "        for _ in range(self.tries):",
             "        for _ in range(1):", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a dropped round's failed emptying ignored (old gradients kept)",
             "Sync-SGD/train.py", "            if not self.emptied(session, count, empty):",
             "            if self.emptied(session, count, empty) is None:", "tests/test_sync_sgd.py",
             RULE),
    Mutation("Sync-SGD: a dropped round said to be whole (its partial step unsaid)",
             "Sync-SGD/train.py", '"half done, its update made to some variables and not to the '
             'others (they stay "\n              "so); every worker', '"half done; every worker',
             "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a worker sends twice to a step with a lost worker's spare token",
             "Sync-SGD/train.py",
             "if self.local_step == sent_to and not args.backup_workers:", "if False:",
             "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a new session's first step unchecked (its local step unknown)",
             "Sync-SGD/train.py", "self.local_step = session.run(optimizer._local_step)",
             "self.local_step = None", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a restarted chief's first step may take a token it handed out",
             "Sync-SGD/train.py", "wait_for(lambda: session.run(self.tokens_left) == 0, "
             "self.tries * self.try_seconds)", "pass", "tests/test_sync_sgd.py", RULE),
    Mutation("Sync-SGD: a worker with a spare token waits for the step after",
             "Sync-SGD/train.py", "session.run(self.optimizer._global_step) > sent_to,",
             "session.run(self.optimizer._global_step) > sent_to + 1,", "tests/test_sync_sgd.py",
             RULE),
    Mutation("MultiWorkerMirroredStrategy: learning rate without x N",
             "MultiWorkerMirroredStrategy/train.py",
             "learning_rate = args.learning_rate * strategy.num_replicas_in_sync",
             "learning_rate = args.learning_rate", "tests/test_multi_worker_mirrored_strategy.py",
             RULE),
    Mutation("MultiWorkerMirroredStrategy: the step reports this worker's loss, not the mean",
             "MultiWorkerMirroredStrategy/train.py", "            return mean_loss\n",
             "            return loss\n", "tests/test_multi_worker_mirrored_strategy.py", RULE),
    Mutation("MultiWorkerMirroredStrategy: the loss's slot taken for a gradient's",
             "MultiWorkerMirroredStrategy/train.py", "mean_loss, *mean = ", "*mean, mean_loss = ",
             "tests/test_multi_worker_mirrored_strategy.py", RULE),
    Mutation("MultiWorkerMirroredStrategy: each worker keeps what its own --log_dir gave",
             "MultiWorkerMirroredStrategy/train.py", "    broadcast_from_the_chief()\n",
             "    pass\n", node("tests/test_multi_worker_mirrored_strategy.py",
                            "test_a_worker_whose_log_dir_lacks_the_chiefs_checkpoint_takes_its_"
                            "step_and_weights"), None),
    Mutation("MultiWorkerMirroredStrategy: the SIGTERM handler counts on from the chief's count",
             "MultiWorkerMirroredStrategy/train.py",
             "mirrored.strategy.cluster_resolver, count_from_zero,",
             "mirrored.strategy.cluster_resolver, checkpoints,", MWMS_SIGTERM, None),
    Mutation("MultiWorkerMirroredStrategy: on Google Cloud the handler watches no SIGTERM",
             "MultiWorkerMirroredStrategy/train.py", "    with google_cloud_unseen():\n",
             "    with contextlib.nullcontext():\n", MWMS_SIGTERM, None),
    Mutation("MultiWorkerMirroredStrategy: Google Cloud hidden by a setenv while threads run",
             "MultiWorkerMirroredStrategy/train.py",
             "    platform.on_gcp = lambda: False  # what",
             '    os.environ["GCE_METADATA_IP"] = "127.0.0.1:9"  # what',
             node("tests/test_multi_worker_mirrored_strategy.py", "test_the_handler_is_kept_from_"
                  "google_cloud_by_its_platform_check_not_by_the_environment"), None),
    Mutation("MultiWorkerMirroredStrategy: a preempted worker leaves its scratch checkpoints",
             "MultiWorkerMirroredStrategy/train.py",
             "        if scratch:\n            shutil.rmtree(scratch, ignore_errors=True)\n"
             "        sys.stdout.flush()\n", "        sys.stdout.flush()\n", MWMS_SIGTERM, None),
    Mutation("MultiWorkerMirroredStrategy: run.sh takes exit 42 for a failure",
             "MultiWorkerMirroredStrategy/run.sh", "((codes[i] && codes[i] != 42)) || continue",
             "((codes[i])) || continue", MWMS_SIGTERM, None),
    Mutation("Non-Distributed-Setup: --optimizer adamw steps with plain SGD",
             "Non-Distributed-Setup/train.py",
             "train_op = tf.compat.v1.train.AdamOptimizer(args.learning_rate).minimize(",
             "train_op = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate).minimize(",
             "tests/test_non_distributed_setup.py", RULE),
    Mutation("Non-Distributed-Setup: AdamW without its weight decay",
             "Non-Distributed-Setup/train.py",
             "p.assign_sub(args.learning_rate * args.weight_decay * p)",
             "p.assign_sub(0.0 * p)", "tests/test_non_distributed_setup.py", RULE),
    Mutation("DiLoCo: outer gradient with the wrong sign", "DiLoCo/train.py",
             "outer_gradients = [start[n] - p for", "outer_gradients = [p - start[n] for",
             "tests/test_diloco.py", RULE),
    Mutation("DiLoCo: Nesterov off (plain momentum on the ps)", "DiLoCo/train.py",
             "use_nesterov=True", "use_nesterov=False", "tests/test_diloco.py", RULE),
    Mutation("EAMSGD: Nesterov off (gradient at the parameters, no look-ahead)", "EAMSGD/train.py",
             "ahead = {name: p + args.momentum * velocity[name]",
             "ahead = {name: p + 0 * velocity[name]", EAMSGD_RULE, RULE),
    Mutation("Hogwild: the clock read at the pull not ordered before the parameters",
             "Hogwild/train.py", "with tf.control_dependencies([pulled_at]):",
             "with tf.control_dependencies([]):",
             node("tests/test_hogwild.py", "test_a_step_reads_the_clock_before_the_parameters"),
             None),
    Mutation("AEASGD: the chief evaluates its local copy, not the centre", "AEASGD/train.py",
             "model_metrics(aeasgd.centre, x, y)", "model_metrics(aeasgd.local_params, x, y)",
             (ELASTIC + "[AEASGD]",), None),
    Mutation("EAMSGD: the chief evaluates its local copy, not the centre", "EAMSGD/train.py",
             "model_metrics(eamsgd.centre, x, y)", "model_metrics(eamsgd.local_params, x, y)",
             (ELASTIC + "[EAMSGD]",), None),
    Mutation("EASGD: the chief evaluates its local copy, not the centre", "EASGD/train.py",
             "model_metrics(easgd.centre, x, y)", "model_metrics(easgd.local_params, x, y)",
             (ELASTIC + "[EASGD]",), None),
    Mutation("In-Graph-Replication: every tower fed the whole mini-batch",
             "In-Graph-Replication/train.py",
             "loss = model_loss(params, x_slices[i], y_slices[i])",
             "loss = model_loss(params, x, y)",
             TOWERS, None),
    Mutation("In-Graph-Replication: the towers' gradients summed, not averaged",
             "In-Graph-Replication/train.py", "[tf.add_n(list(g)) / len(devices) for g",
             "[tf.add_n(list(g)) for g", TOWERS, None),
    Mutation("In-Graph-Replication: every tower on the first device",
             "In-Graph-Replication/train.py",
             'with tf.compat.v1.device(device), tf.compat.v1.name_scope("tower%d" % i):',
             'with tf.compat.v1.device(devices[0]), tf.compat.v1.name_scope("tower%d" % i):',
             node(ONE_CLIENT, "test_each_tower_runs_on_its_own_device_and_the_update_on_the_"
                  "controller", "test_on_a_cluster_each_worker_task_runs_its_tower_and_task_0_"
                  "holds_the_variables"), None),
    Mutation("One client: a finished run, resumed, takes one more step",
             "In-Graph-Replication/train.py", "if self.step >= self.args.steps:", "if False:",
             node(ONE_CLIENT, "test_a_rerun_with_the_same_log_dir_resumes_and_a_finished_run_"
                  "takes_no_step"), None),
    Mutation("One client: a port in use told as any other error", "In-Graph-Replication/train.py",
             'if "Could not start gRPC server" in e.message:', "if False:",
             node(ONE_CLIENT, "test_a_port_in_use_fails_in_one_line"), None),
    Mutation("One client: a worker serves for ever when no client comes",
             "In-Graph-Replication/train.py",
             "if not wait_for(lambda: session.run(set_up), args.connect_timeout):",
             "if not wait_for(lambda: session.run(set_up)):",
             node(ONE_CLIENT, "test_a_client_without_its_workers_and_a_worker_without_its_client_"
                  "give_up_in_one_line"), None),
    Mutation("One client: a lost worker's client exits as usual (its session's close hangs)",
             "In-Graph-Replication/train.py", "        os._exit(2)  # exit() would close",
             "        sys.exit(2)  # exit() would close",
             node(ONE_CLIENT, "test_a_lost_worker_ends_the_client_in_one_line_and_nothing_is_"
                  "left"), None),
    Mutation("One client: a worker ends with its client (none is left for a restarted one)",
             "In-Graph-Replication/train.py", "    wait_for(lambda: session.run(run_over))\n",
             "    wait_for(lambda: session.run(run_over) or not is_listening("
             "cluster['worker'][0]))\n",
             RESTARTED_CLIENT, None),
    Mutation("One client: the run-over flag a global variable, which the checkpoints hold",
             "In-Graph-Replication/train.py", "tf.compat.v1.get_local_variable(",
             "tf.compat.v1.get_variable(", RESTARTED_CLIENT, None),
    Mutation("Model-Parallel-Pipeline: a stage may get no layer",
             "Model-Parallel-Pipeline/train.py",
             "for count in range(1, len(weights) - first - stages + 2):",
             "for count in range(0, len(weights) - first - stages + 2):",
             node("tests/test_model_parallel_pipeline.py", "test_each_stage_gets_a_run_of_whole_"
                  "layers_and_the_largest_stage_is_as_small_as_can_be"), None),
    Mutation("Model-Parallel-Pipeline: a GPU's kernels (its streams) not counted as busy",
             "Model-Parallel-Pipeline/train.py", '.replace("/replica:0", "").split("/stream:")[0]',
             '.replace("/replica:0", "")', BUSY_TIME, None),
    Mutation("Model-Parallel-Pipeline: waiting for a tensor counted as busy",
             "Model-Parallel-Pipeline/train.py", 'if stages and op.node_name != "RecvTensor":',
             "if stages:", BUSY_TIME, None),
    Mutation("Model-Parallel-Pipeline: the micro-batches' gradients summed, not averaged",
             "Model-Parallel-Pipeline/train.py", "tf.add_n(list(g)) / micro_batches)",
             "tf.add_n(list(g)))", node("tests/test_model_parallel_pipeline.py",
                                  "test_m_micro_batches_give_the_same_update_as_one"), None),
    Mutation("Model-Parallel-Pipeline: every layer's variables on the first stage",
             "Model-Parallel-Pipeline/train.py",
             "with tf.compat.v1.device(devices[stage]):  # each layer's variables on its stage",
             "with tf.compat.v1.device(devices[0]):  # each layer's variables on its stage",
             node(PIPELINE, "test_each_layer_lives_and_works_on_its_stages_task"), None),
    Mutation("Model-Parallel-Pipeline: a stage's last layer without its ReLU (logits too soon)",
             "Model-Parallel-Pipeline/train.py",
             "h = layer_forward(layers[i], h, is_last=i == len(layers) - 1)",
             "h = layer_forward(layers[i], h, is_last=stage_of[i + 1:i + 2] != [stage])",
             node(PIPELINE, "test_the_split_models_loss_and_gradients_equal_the_unsplit_models"),
             None),
    Mutation("Model-Parallel-Pipeline: every micro-batch the whole mini-batch",
             "Model-Parallel-Pipeline/train.py",
             "x_micro, y_micro = tf.split(x, micro_batches), tf.split(y, micro_batches)",
             "x_micro, y_micro = [x] * micro_batches, [y] * micro_batches",
             node(PIPELINE, "test_the_micro_batches_are_different_slices_of_the_mini_batch"), None),
    Mutation("Model-Parallel-Pipeline: overlapping busy intervals counted twice",
             "Model-Parallel-Pipeline/train.py", "if reached is None or start > reached:",
             "if True:", node(PIPELINE, "test_covered_time_counts_overlapping_intervals_once"),
             None),
    Mutation("Model-Parallel-Pipeline: a stage waits for the last stage (no pipeline)",
             "Model-Parallel-Pipeline/train.py", "[last_output[stage]] if m else []",
             "[last_output[-1]] if m else []",
             node("tests/test_model_parallel_pipeline.py",
                  "test_a_stage_waits_for_its_own_previous_micro_batch_and_never_for_the_next_stage",
                  "test_in_a_traced_step_stage_1_works_on_a_micro_batch_while_stage_0_works_on_the_"
                  "next"), None),
    Mutation("Gradient-Compression: error feedback off where it is claimed on (no residual kept)",
             "Gradient-Compression/train.py",
             "if error_feedback:  # keep what the message missed",
             "if False:  # keep what the message missed", "tests/test_gradient_compression.py",
             RULE),
    Mutation("Gradient-Compression: the residual's sign flipped", "Gradient-Compression/train.py",
             "residuals[n].assign(p[n] - sent[n], read_value=False)",
             "residuals[n].assign(sent[n] - p[n], read_value=False)",
             "tests/test_gradient_compression.py", RULE),
    Mutation("Gradient-Compression: QSGD's scale (the norm) dropped", "Gradient-Compression/train.py",
             "return norm * tf.cast(levels, tf.float32) / self.args.levels",
             "return tf.cast(levels, tf.float32) / self.args.levels",
             "tests/test_gradient_compression.py", RULE),
    Mutation("Gradient-Compression: sign(0) sent as + (a zero gradient moves by -scale)",
             "Gradient-Compression/train.py", "tf.cast(tf.sign(flat), tf.int32) + 1",
             "tf.cast(tf.where(flat >= 0, 1.0, -1.0), tf.int32) + 1",
             "tests/test_gradient_compression.py", RULE),
    Mutation("Gradient-Compression: PowerSGD starts every step from the first Q (no warm start)",
             "Gradient-Compression/train.py",
             "for n in low_rank]):  # the next step starts from this Q",
             "for n in []]):  # the next step starts from this Q",
             "tests/test_gradient_compression.py", RULE),
    Mutation("Gradient-Compression: sampled top-k sends the first k entries above its threshold",
             "Gradient-Compression/train.py",
             "candidates, tf.math.top_k(tf.gather(magnitudes, candidates), k).indices)",
             "candidates, tf.range(k))", "tests/test_gradient_compression.py", RULE),
    Mutation("Gradient-Compression: sampled top-k trusts its threshold when fewer than k reach it",
             "Gradient-Compression/train.py", "return tf.cond(tf.size(candidates) >= k,",
             "return tf.cond(tf.size(candidates) >= 0,", "tests/test_gradient_compression.py",
             RULE),
    Mutation("Gradient-Compression: two ps taken (the step would cross from ps 0 dense)",
             "Gradient-Compression/train.py", 'if len(cluster["ps"]) > 1:', "if False:",
             node("tests/test_gradient_compression.py",
                  "test_more_than_one_ps_is_refused_in_one_line_before_tensorflow_loads"), None),
    Mutation("Gradient-Compression: the step counted before the ps applies it",
             "Gradient-Compression/train.py",
             "with tf.control_dependencies(applied):  # not before",
             "with tf.control_dependencies([]):  # not before",
             "tests/test_gradient_compression.py", RULE),
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
        tests = (mutation.tests,) if isinstance(mutation.tests, str) else mutation.tests
        select = ["-m", mutation.select] if mutation.select else []
        # -n 0: the few tests of a mutation in this process, not in pytest.ini's two workers
        run = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-n", "0", "-p",
                              "no:cacheprovider", *select],
                             cwd=ROOT, capture_output=True, text=True, timeout=1200)
    finally:
        with open(path, "w") as f:
            f.write(original)
    failed = re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", run.stdout, re.M)
    if not failed and run.returncode not in (0, 1):  # no test ran, or pytest itself failed
        last = (run.stdout.strip() or run.stderr.strip() or "no output").splitlines()[-1]
        failed = ["(pytest exit %d: %s)" % (run.returncode, last)]
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
