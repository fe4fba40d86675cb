"""One update of a TensorFlow 2 strategy example on a tiny known dataset, for the tests. Run from
tests/ as a module of the support package (cd tests && python -m support.strategy_step ...):

    support.strategy_step ParameterServerStrategy OUT.npz PS,WORKER,CHIEF
        a ps, a worker and the coordinator in this process (real gRPC servers); one scheduled
        call of one step on the worker's whole shard
    support.strategy_step ParameterServerStrategy-two-workers OUT.npz PS,WORKER0,WORKER1,CHIEF
        a ps, two workers and the coordinator in this process; 16 scheduled calls that each
        read one mini-batch (the worker's whole shard) and say which worker read it
    support.strategy_step Sparse-Embeddings-TF2 OUT.npz PS0,PS1,WORKER,CHIEF [dense]
        2 ps, a worker and the coordinator in this process; one call of one step on a table
        of 2 slices; dense: with a model that reads the embeddings whole (the error it gives)
    support.strategy_step MultiWorkerMirroredStrategy OUT.npz TASK_INDEX PORT0,PORT1 [FLAG...]
        one of two workers (start both), train.py's FLAGs added: one synchronous step, each on
        its whole shard (also saves the loss the step returns)
    support.strategy_step first-batches:EXAMPLE OUT.npz PORTS
        EXAMPLE's training data as a run that starts at global step 0 reads it, again at 0, and
        at 300 (a resumed run): the first mini-batch each time, of worker 0 (a ps, a worker and
        the coordinator in this process; one worker for the examples without a ps, on PORTS'
        first port; Keras-Fit needs tf_keras: run it in the user's environment)

Writes the parameters before and after the update, and the dataset, to OUT.npz (the test
computes what the update should have been, apart from the example). pytest does not collect
this file; support/strategies.py runs it.
"""
import json
import os
import sys

import numpy as np

from support.examples import load_train_module

EXAMPLES_PER_WORKER, FEATURES, HIDDEN, LEARNING_RATE = 16, 5, 8, 0.1


def known_data(module, workers):
    """Pixels in [0, 1] and labels, EXAMPLES_PER_WORKER for each worker: a batch a shard."""
    rng = np.random.default_rng(7)
    n = EXAMPLES_PER_WORKER * workers
    return module.Dataset((rng.integers(0, 17, (n, FEATURES)) / 16).astype(np.float32),
                          rng.integers(0, 10, n).astype(np.int64),
                          np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64), 10)


def parse_flags(module, argv, example_flags):
    """train.py's flags, as its main() has them once it has read the cluster (which a harness
    here starts itself)."""
    args = module.parse_flags(argv, example_flags)
    args.connect_timeout = 60.0
    return args


def values(params):
    return {name: p.numpy() for name, p in params.items()}


def save(path, data, before, after, **extra):
    np.savez(path, x=data.x_train, y=data.y_train, **extra,
             **{"before_" + n: v for n, v in before.items()},
             **{"after_" + n: v for n, v in after.items()})


def servers_in_this_process(ps, workers):
    """A ParameterServerStrategy cluster on the ports of argv[3] (the ps, then the workers, then
    the chief): its ps and worker servers started in this process, which is its chief. Returns
    the cluster and TensorFlow, loaded once TF_CONFIG is set (the examples load after it too)."""
    ports = ["localhost:%d" % int(p) for p in sys.argv[3].split(",")]
    cluster = {"ps": ports[:ps], "worker": ports[ps:ps + workers], "chief": [ports[ps + workers]]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief",
                                                                      "index": 0}})
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(4)  # servers and coordinator: 2 cores
    # threads enough for every server of the process: a worker's dataset function that reads a
    # variable on the ps holds one while it waits for the ps (a process of its own has its own)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
    spec = tf.train.ClusterSpec(cluster)
    for job in ("ps", "worker"):
        for index in range(len(cluster[job])):
            tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc",
                                 config=config, start=True)
    return cluster, tf


def parameter_server_strategy(out):
    cluster, tf = servers_in_this_process(ps=1, workers=1)
    module = load_train_module("ParameterServerStrategy")
    args = parse_flags(module, ["--hidden", str(HIDDEN), "--learning_rate", str(LEARNING_RATE),
                               "--batch_size", str(EXAMPLES_PER_WORKER), "--steps_per_call", "1",
                               "--ps_hosts", cluster["ps"][0], "--worker_hosts",
                               cluster["worker"][0], "--chief_host", cluster["chief"][0]],
                              module.example_flags)
    data = known_data(module, 1)
    pss = module.build_pss(args, cluster, data)
    before = values(pss.params)
    pss.coordinator.schedule(pss.train_steps, args=(pss.per_worker_batches(),))
    pss.coordinator.join()
    save(out, data, before, values(pss.params))


def parameter_server_strategy_two_workers(out):
    cluster, tf = servers_in_this_process(ps=1, workers=2)
    module = load_train_module("ParameterServerStrategy")
    args = parse_flags(module, ["--hidden", str(HIDDEN), "--batch_size", str(EXAMPLES_PER_WORKER),
                               "--ps_hosts", cluster["ps"][0], "--worker_hosts",
                               ",".join(cluster["worker"]), "--chief_host", cluster["chief"][0]],
                              module.example_flags)
    data = known_data(module, 2)
    pss = module.build_pss(args, cluster, data)

    @tf.function
    def read_a_mini_batch(iterator):  # on whichever worker the coordinator picks
        x, _ = next(iterator)
        return tf.distribute.coordinator.experimental_get_current_worker_index(), x
    iterator = pss.per_worker_batches()
    calls = [pss.coordinator.schedule(read_a_mini_batch, args=(iterator,)) for _ in range(16)]
    pss.coordinator.join()
    read = [call.fetch() for call in calls]
    np.savez(out, x=data.x_train,
             worker=np.array([int(w) for w, _ in read]), batches=np.stack([b for _, b in read]))


def sparse_embeddings_tf2(out):
    cluster, tf = servers_in_this_process(ps=2, workers=1)
    module = load_train_module("Sparse-Embeddings-TF2")
    # 40000 x 4 floats: 640 kB, two slices of the partitioner's 256 kB at least
    args = parse_flags(module, ["--rows", "40000", "--dim", "4", "--batch_size", "8",
                               "--steps_per_call", "1", "--learning_rate", "1",
                               "--ps_hosts", ",".join(cluster["ps"]), "--worker_hosts",
                               cluster["worker"][0], "--chief_host", cluster["chief"][0]],
                              module.example_flags)
    data = module.make_clicks(args.rows, train_examples=1000, test_examples=10)
    if sys.argv[4:] == ["dense"]:  # a user's model that scales the whole table, then looks up
        sparse_loss = module.model_loss

        def model_loss(params, ids, clicks):
            whole = tf.convert_to_tensor(params["embeddings"]) * 1.0
            return sparse_loss(dict(params, embeddings=whole), ids, clicks)
        module.model_loss = model_loss
    pss = module.build_sparse_pss(args, cluster, data)
    tables = lambda: {n: np.concatenate([v.numpy() for v in getattr(p, "variables", [p])])
                      for n, p in pss.params.items() if n != "bias"}
    before = tables()
    first_batch = next(iter(module.training_dataset(data, args.batch_size, 0, 1, args.seed)))
    try:
        pss.coordinator.schedule(pss.train_steps, args=(pss.per_worker_batches(),))
        pss.coordinator.join()
        error = ""
    except Exception as e:  # the test reads what the user would see
        error = "%s: %s" % (type(e).__name__, e)
    np.savez(out, ids=first_batch[0].numpy(), error=error, rows=args.rows,
             slices=len(getattr(pss.params["embeddings"], "variables", [0])),
             **{"before_" + n: v for n, v in before.items()},
             **{"after_" + n: v for n, v in tables().items()})


def multi_worker_mirrored_strategy(out):
    task, ports = int(sys.argv[3]), sys.argv[4].split(",")
    cluster = {"worker": ["localhost:%s" % p for p in ports]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                      "index": task}})
    module = load_train_module("MultiWorkerMirroredStrategy")
    args = parse_flags(module, ["--hidden", str(HIDDEN), "--learning_rate", str(LEARNING_RATE),
                               "--batch_size", str(EXAMPLES_PER_WORKER), "--worker_hosts",
                               ",".join(cluster["worker"]), "--task_index", str(task)]
                              + sys.argv[5:], module.example_flags)
    data = known_data(module, len(ports))
    mirrored = module.build_mirrored(args, cluster, data)
    before = values(mirrored.params)
    loss = mirrored.train_step(mirrored.batches())
    save(out, data, before, values(mirrored.params), loss=float(loss))


START_STEPS = (0, 0, 300)  # first_batches': a run, the same run again, and one resumed at 300


def first_batches(out, example):
    """Worker 0's first mini-batch of a run started at each of START_STEPS (its global step set
    before the run's datasets are made, as a restore sets it)."""
    coordinated = example in ("ParameterServerStrategy", "Sparse-Embeddings-TF2")
    if coordinated:
        cluster, tf = servers_in_this_process(ps=1, workers=1)
    else:  # one worker, of a mirrored strategy
        cluster = {"worker": ["localhost:%d" % int(sys.argv[3].split(",")[0])]}
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                          "index": 0}})
    module = load_train_module(example)  # (TensorFlow loads now, once TF_CONFIG is set)
    flags = {"ParameterServerStrategy": ["--steps_per_call", "1"],
             "Sparse-Embeddings-TF2": ["--steps_per_call", "1", "--rows", "1000", "--dim", "2"],
             "MultiWorkerMirroredStrategy": [],
             "Keras-Fit": ["--strategy", "multi_worker_mirrored"]}[example]
    hosts = [item for job in ("ps", "worker", "chief") if job in cluster for item in (
        "--chief_host" if job == "chief" else "--%s_hosts" % job, ",".join(cluster[job]))]
    args = parse_flags(module, ["--batch_size", "8"] + flags + hosts, module.example_flags)
    data = module.make_clicks(1000, 500, 10) if "Sparse" in example else known_data(module, 4)
    batches = []
    if coordinated:
        build = module.build_sparse_pss if "Sparse" in example else module.build_pss
        pss = build(args, cluster, data)
        read = tf.function(lambda iterator: next(iterator)[0])
        for start in START_STEPS:
            pss.global_step.assign(start)
            batch = pss.coordinator.schedule(read, args=(pss.per_worker_batches(),))
            pss.coordinator.join()  # the dataset made, at this step, before the next
            batches.append(batch.fetch())
    elif example == "MultiWorkerMirroredStrategy":
        mirrored = module.build_mirrored(args, cluster, data)
        for start in START_STEPS:
            mirrored.global_step.assign(start)
            x = next(mirrored.batches())[0]
            batches.append(mirrored.strategy.experimental_local_results(x)[0].numpy())
    else:  # Keras-Fit: fit's DatasetCreator, handed to the strategy as fit hands it
        import tf_keras
        module.keras = tf_keras
        fit = module.build_fit(args, cluster, data)
        for start in START_STEPS:
            fit.model.optimizer.iterations.assign(start)
            x = next(iter(fit.strategy.distribute_datasets_from_function(fit.inputs)))[0]
            batches.append(fit.strategy.experimental_local_results(x)[0].numpy())
    np.savez(out, batches=np.stack(batches))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    {"ParameterServerStrategy": parameter_server_strategy,
     "ParameterServerStrategy-two-workers": parameter_server_strategy_two_workers,
     "Sparse-Embeddings-TF2": sparse_embeddings_tf2,
     "MultiWorkerMirroredStrategy": multi_worker_mirrored_strategy,
     **{"first-batches:" + example: lambda out, example=example: first_batches(out, example)
        for example in ("ParameterServerStrategy", "Sparse-Embeddings-TF2",
                        "MultiWorkerMirroredStrategy", "Keras-Fit")}}[sys.argv[1]](sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # the in-process servers would keep the process alive
