"""Model-Parallel-Pipeline: the split model computes what the whole model does, M micro-batches
make the update of one, every layer's variables and work stay on its stage's task, each stage's
busy time is measured, and a run over two tasks trains to the bar and ends by itself."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from support.examples import ROOT, error_lines, load_train_module, run_train
from support.in_process import fixed_batch
from support.processes import free_ports
from support.runs import summary_of

EXAMPLE = "Model-Parallel-Pipeline"


def pipeline_graph(*argv, cluster=None, batch=32):
    """The example's pipeline on fixed_batch(batch), in a graph of its own (a small model)."""
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    args = module.parse_flags(["--hidden", "16", "--layers", "3"] + list(argv),
                              module.example_flags)
    module.resolve_workers(args)
    graph = tf.Graph()
    with graph.as_default():
        devices, _ = module.run_devices(args, cluster)
        pipeline = module.build_pipeline(args, devices, *fixed_batch(n=batch))
        init = tf.compat.v1.global_variables_initializer()
    return module, args, graph, pipeline, init


def one_step(*argv):
    """(loss, gradients, parameters before, parameters after) of one step, alone."""
    import tensorflow as tf
    module, args, graph, pipeline, init = pipeline_graph(*argv)
    variables = [v for layer in pipeline.layers for v in (layer["w"], layer["b"])]
    with tf.compat.v1.Session(graph=graph, config=module.task_config(args)) as session:
        session.run(init)
        before = session.run(variables)
        loss, gradients = session.run([pipeline.loss, pipeline.gradients])
        session.run(pipeline.step)
        after = session.run(variables)
    return loss, gradients, before, after


def assert_all_close(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg="variable %d" % i)


def largest_stage(sizes, stage_of):
    weights = [a * b for a, b in zip(sizes, sizes[1:])]
    return max(sum(w for w, s in zip(weights, stage_of) if s == stage)
               for stage in set(stage_of))


def every_split(layers, stages):
    """Every way to cut layers consecutive layers into stages runs of at least one layer."""
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0,) + cuts + (layers,)
        yield [s for s in range(stages) for _ in range(bounds[s], bounds[s + 1])]


@pytest.mark.rule
def test_each_stage_gets_a_run_of_whole_layers_and_the_largest_stage_is_as_small_as_can_be():
    module = load_train_module(EXAMPLE)
    sizes = [64] + [256] * 5 + [10]  # the default model: 4 square matrices between two thin
    assert module.stage_of_each_layer(sizes, 2) == [0, 0, 0, 1, 1, 1]
    assert module.stage_of_each_layer(sizes, 4) == [0, 0, 1, 2, 3, 3]
    assert module.stage_of_each_layer(sizes, 1) == [0] * 6
    # as many stages as layers: a layer each (no stage only relays what it is given)
    assert module.stage_of_each_layer(sizes, 6) == [0, 1, 2, 3, 4, 5]
    # --layers 6 on 3 stages: 16k+65k | 65k+65k | 65k+65k+3k, the largest 134k, not 147k
    six = [64] + [256] * 6 + [10]
    assert largest_stage(six, module.stage_of_each_layer(six, 3)) == 65536 * 2 + 2560
    rng = np.random.default_rng(0)
    for _ in range(30):  # against every possible split of random models
        sizes = rng.integers(1, 50, rng.integers(2, 9)).tolist()
        layers = len(sizes) - 1
        for stages in range(1, layers + 1):
            stage_of = module.stage_of_each_layer(sizes, stages)
            assert stage_of in list(every_split(layers, stages)), (sizes, stage_of)
            assert largest_stage(sizes, stage_of) == min(
                largest_stage(sizes, split) for split in every_split(layers, stages))


@pytest.mark.rule
def test_the_split_models_loss_and_gradients_equal_the_unsplit_models():
    whole = one_step("--devices", "1", "--micro_batches", "1")
    split = one_step("--devices", "2", "--micro_batches", "1")
    assert whole[0] == pytest.approx(split[0], rel=1e-6)
    assert_all_close(whole[2], split[2])  # the same initial parameters
    assert all(np.abs(g).max() > 1e-4 for g in whole[1])
    assert_all_close(whole[1], split[1])


@pytest.mark.rule
@pytest.mark.parametrize("micro_batches", [2, 4, 8])
def test_m_micro_batches_give_the_same_update_as_one(micro_batches):
    one = one_step("--devices", "2", "--micro_batches", "1")
    many = one_step("--devices", "2", "--micro_batches", str(micro_batches))
    assert many[0] == pytest.approx(one[0], rel=1e-5)  # the mean of the micro-batches' losses
    assert_all_close(many[1], one[1])  # the accumulated gradient
    assert not all(np.allclose(b, a) for b, a in zip(one[2], one[3]))  # the step moved them
    assert_all_close(many[3], one[3])  # and to the same place


@pytest.mark.rule
def test_the_micro_batches_are_different_slices_of_the_mini_batch():
    import tensorflow as tf
    module, args, graph, pipeline, init = pipeline_graph("--micro_batches", "4")
    splits = [op for op in graph.get_operations() if op.type == "Split"]
    with tf.compat.v1.Session(graph=graph) as session:
        x_micro = session.run([t for t in splits[0].outputs])
    assert [len(x) for x in x_micro] == [8, 8, 8, 8]
    rows = [set(map(bytes, x)) for x in x_micro]
    assert all(not rows[i] & rows[j] for i in range(4) for j in range(i + 1, 4))


def ancestors(op):
    """Every op that op waits for, through its inputs and control inputs."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for before in [t.op for t in current.inputs] + list(current.control_inputs):
            if before.name not in seen:
                seen.add(before.name)
                todo.append(before)
    return seen


@pytest.mark.rule
def test_a_stage_waits_for_its_own_previous_micro_batch_and_never_for_the_next_stage():
    module, args, graph, pipeline, init = pipeline_graph("--devices", "2", "--micro_batches", "4")

    def first_op(stage, m):  # where the stage takes the micro-batch in
        return graph.get_operation_by_name("stage%d/micro%d/Identity" % (stage, m))
    for m in range(1, 4):
        waits_for = ancestors(first_op(0, m))
        assert any(n.startswith("stage0/micro%d/" % (m - 1)) for n in waits_for)  # GPipe's order
        # the pipeline: stage 0 may take micro-batch m while stage 1 still works on m - 1
        assert not any(n.startswith("stage1/") for n in waits_for), m
        assert any(n.startswith("stage0/micro%d/" % m) for n in ancestors(first_op(1, m)))


@pytest.mark.rule
def test_in_a_traced_step_stage_1_works_on_a_micro_batch_while_stage_0_works_on_the_next():
    # GPipe's overlap, seen in time: within a step, some forward op of stage 1 on micro-batch
    # m runs while one of stage 0 on m + 1 runs (two logical CPUs; one step may happen not to
    # overlap on a busy machine, so up to 20 traced steps)
    import tensorflow as tf
    module, args, graph, pipeline, init = pipeline_graph(
        "--devices", "2", "--micro_batches", "4", "--hidden", "1024", batch=1024)

    def forward_spans(metadata, stage, m):
        prefix = "stage%d/micro%d/" % (stage, m)
        return [(op.all_start_micros, op.all_start_micros + op.all_end_rel_micros)
                for device in metadata.step_stats.dev_stats for op in device.node_stats
                if op.node_name.startswith(prefix)]

    def overlap(a, b):
        return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)
    with tf.compat.v1.Session(graph=graph, config=module.task_config(args)) as session:
        session.run(init)
        for _ in range(20):
            metadata = tf.compat.v1.RunMetadata()
            session.run(pipeline.step, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
            assert forward_spans(metadata, 1, 3), "the trace has no forward op of stage 1"
            if any(overlap(forward_spans(metadata, 1, m), forward_spans(metadata, 0, m + 1))
                   for m in range(3)):
                return
    pytest.fail("in 20 steps stage 1 never worked while stage 0 took the next micro-batch")


@pytest.mark.rule
def test_each_layer_lives_and_works_on_its_stages_task():
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    cluster = {"worker": ["localhost:%d" % p for p in free_ports(2)]}
    args = module.parse_flags([], module.example_flags)
    servers = [tf.compat.v1.train.Server(cluster, job_name="worker", task_index=i,
                                         config=module.task_config(args)) for i in range(2)]
    module, args, graph, pipeline, init = pipeline_graph(
        "--micro_batches", "2", "--worker_hosts", ",".join(cluster["worker"]), cluster=cluster)
    assert pipeline.stage_of == [0, 0, 1, 1]
    for layer, stage in zip(pipeline.layers, pipeline.stage_of):
        for v in layer.values():
            assert v.device == "/job:worker/task:%d/device:CPU:0" % stage, v.name
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(servers[0].target, graph=graph) as session:
        session.run(init)
        session.run(pipeline.step, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    ran = {0: set(), 1: set()}
    for device in metadata.step_stats.dev_stats:
        task = int(device.device.split("task:")[1][0])
        ran[task] |= {op.node_name for op in device.node_stats
                      if op.node_name != "RecvTensor"}  # not a tensor in transit

    def work_of(stage, names):  # the stage's forward and backward ops, variable reads aside
        return {n for n in names if "stage%d/" % stage in n and not n.endswith("ReadVariableOp")}
    for stage in (0, 1):
        assert any(n.startswith("stage%d/" % stage) for n in work_of(stage, ran[stage]))
        assert any(n.startswith("gradients") for n in work_of(stage, ran[stage]))  # backward
        assert not work_of(stage, ran[1 - stage]), (stage, sorted(work_of(stage, ran[1 - stage])))


@pytest.mark.rule
def test_covered_time_counts_overlapping_intervals_once():
    module = load_train_module(EXAMPLE)
    assert module.covered([]) == 0
    assert module.covered([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


@pytest.mark.rule
def test_a_stages_busy_time_is_its_devices_work_gpu_streams_included_never_its_waits():
    # a traced step as TensorFlow logs it: 100 us long; stage 0's GPU ran kernels for 40 us
    # (logged under its stream) after 10 us of launches; stage 1 waited 50 us for a tensor,
    # then its kernels ran 50 us on one stream, also logged under stream:all
    from tensorflow.core.framework import step_stats_pb2
    module = load_train_module(EXAMPLE)
    clock = module.StageClock(["/job:worker/task:0/device:GPU:0",
                               "/job:worker/task:1/device:GPU:0"])
    step = step_stats_pb2.StepStats()
    for device, name, start, length in [
            ("/job:worker/replica:0/task:0/device:GPU:0", "stage0/micro0/MatMul", 0, 10),
            ("/job:worker/replica:0/task:0/device:GPU:0/stream:all", "MatMul", 5, 40),
            ("/job:worker/replica:0/task:1/device:GPU:0", "RecvTensor", 0, 50),
            ("/job:worker/replica:0/task:1/device:GPU:0/stream:7", "MatMul", 50, 50),
            ("/job:worker/replica:0/task:1/device:GPU:0/stream:all", "MatMul", 50, 50)]:
        stats = step.dev_stats.add(device=device).node_stats.add(node_name=name)
        stats.all_start_micros, stats.all_end_rel_micros = start, length
    clock.count(step)
    assert clock.fractions() == [0.45, 0.5]


@pytest.mark.parametrize("argv, message", [
    (["--batch_size", "64", "--micro_batches", "3"], "cannot be cut into 3 micro-batches"),
    (["--devices", "4", "--layers", "2"], "4 stages for 3 layers: give --layers 3 or more"),
])
def test_a_pipeline_it_cannot_build_fails_in_one_line(argv, message, tmp_path):
    code, out, err = run_train(EXAMPLE, argv + ["--log_dir", str(tmp_path)])
    assert code == 2 and "Traceback" not in err
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0], err


def test_alone_on_two_devices_it_reports_each_stages_busy_fraction(tmp_path):
    code, out, err = run_train(EXAMPLE, ["--devices", "2", "--steps", "60", "--log_every", "20",
                                         "--log_dir", str(tmp_path)])
    assert code == 0, err[-2000:]
    summary = summary_of(out)
    assert summary["stages"] == "2" and summary["micro_batches"] == "4"
    busy = [float(b) for b in summary["stage_busy"].split(",")]
    assert len(busy) == 2 and all(0 < b <= 1 for b in busy), busy


def test_across_two_tasks_its_client_drives_both(default_runs):
    # the bar, and every process ending by itself: test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    assert summary["stages"] == "2" and summary["workers"] == "2"
    assert summary["global_step"] == "2000"
    assert "[worker0] the model on 2 device(s): /job:worker/task:0/device:CPU:0 " \
           "/job:worker/task:1/device:CPU:0" in run.output


@pytest.mark.benchmark
@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_the_pipeline_benchmark_smoke_run_measures_every_m_and_leaves_nothing(tmp_path):
    from support.namespaces import assert_runs_left_nothing, missing_for_namespaces
    if missing_for_namespaces():
        pytest.skip(missing_for_namespaces())
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pipeline.py"),
                           "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    table = (out / "pipeline.md").read_text()
    for m in (1, 2, 4, 8):
        assert "\n| %d |" % m in table, table
    assert (out / "pipeline.png").read_bytes().startswith(b"\x89PNG")
    assert len(assert_runs_left_nothing(tmp_path, out / "logs")) == 4  # a cluster per M, gone
