"""The set-up the notebooks share, written out once (1-Servers.ipynb builds each piece in view).

    free_port()                          a TCP port nobody uses right now
    start_server(cluster, job, index)    this task's tf.distribute.Server, its port checked first
    worker_session(server, index, ...)   a Session on a worker that waits only for the ps and itself

The lesson's own calls (the ClusterSpec, the device scopes, the session runs) stay in the
notebooks; only these three helpers, the same in every notebook, live here.
"""

import socket

import tensorflow as tf


def free_port():
    """A port nobody is using right now, so a notebook never collides with another run."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_server(cluster, job, index, advice="run the notebook again from the top to pick "
                                             "new free ports", config=None):
    """This task's server, once its port is known to be free (as the examples check it):
    a taken port would otherwise fail with a bare "Could not start gRPC server". config: the
    server's ConfigProto, if not TensorFlow's default."""
    host, port = cluster.task_address(job, index).rsplit(":", 1)
    with socket.socket() as s:
        if s.connect_ex((host, int(port))) == 0:  # someone answers: the port is taken
            raise OSError("port %s is already in use: by an earlier run? %s" % (port, advice))
    # tf.distribute.Server and tf.compat.v1.train.Server are one class under two names
    return tf.distribute.Server(cluster, job_name=job, task_index=index, config=config)


def worker_session(server, worker_index, graph=None, operation_timeout_s=None):
    """A session on worker worker_index's server that waits only for the ps tasks and that
    worker (device_filters; without them it waits for every task, 1-Servers.ipynb). With
    operation_timeout_s, a blocking operation (a dequeue, say) fails after that many seconds."""
    config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", "/job:worker/task:%d" % worker_index])
    if operation_timeout_s is not None:
        config.operation_timeout_in_ms = int(operation_timeout_s * 1000)
    return tf.compat.v1.Session(server.target, graph=graph, config=config)
