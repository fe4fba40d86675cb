"""A real Slurm on this machine, and jobs of deploy/slurm/train.sbatch submitted to it.

Slurm runs as it would on three machines: munged (credentials), slurmctld (the controller) and
a slurmd for each node, n8, n9 and n10, every node a host of its own: a network namespace on a
bridge (benchmarks/cluster.py's Network), with its own host name and its own /etc/hosts naming
the three. The controller runs on n8, and the tests' Slurm commands reach it from n8's network.
Everything lives in one temporary folder (configuration, keys, state, spool, logs, the jobs'
output and log directories); nothing of the system's is read or changed, and the daemons'
ports are those of the nodes' own namespaces. At the end every job is cancelled, every daemon
stopped, any process still in a node's namespace killed (and named: the tests fail on it), the
namespaces deleted and the folder removed. It needs root, Slurm's and munge's programs (Debian:
apt-get install slurm-wlm munge), iproute2's ip and util-linux's unshare and nsenter.
"""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from support.examples import ROOT, environment_without_tf_config
from support.processes import left_behind, processes_mentioning
from support.runs import summary_of

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cluster as cluster_tool  # noqa: E402  (benchmarks/ is not a package)

TRAIN_SBATCH = os.path.join(ROOT, "deploy", "slurm", "train.sbatch")
# Sorted by name they are n10, n8, n9, not the order Slurm gives them (as on a cluster past
# node9), which TensorFlow's resolver would get wrong: deploy/slurm/tasks.py corrects it.
NODES = ("n8", "n9", "n10")
SUBNET = "10.79.0.0/24"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo",
            "ip", "unshare", "nsenter")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def missing_for_slurm():
    """Why a Slurm cannot be started here (one line), or None."""
    if os.geteuid() != 0:
        return "starting Slurm's daemons needs root"
    missing = [p for p in PROGRAMS if not shutil.which(p)]
    if missing:
        return ("not found on PATH: %s (apt-get install slurm-wlm munge iproute2 util-linux)"
                % ", ".join(missing))
    return None


def node_line():
    """This machine as slurmd describes it (a node declared bigger than it is drains)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
    line = out.stdout.splitlines()[0]
    return line.split(" ", 1)[1]  # after NodeName=<this host>


CONFIG = """\
ClusterName=dtfg
SlurmctldHost={head}({head_address})
AuthType=auth/munge
AuthInfo=socket={folder}/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes={node_list} Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
"""


class Slurm(object):
    """with Slurm() as slurm: slurm.submit(...) -> Job. Started on entry, all gone on exit."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="dtfg-slurm-")
        self.network = cluster_tool.Network("dtfgslurm%d" % os.getpid(), NODES, subnet=SUBNET)
        self.daemons = []  # (name, Popen)
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.left = []  # what the clean-up had to kill: (pid, command line)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # --- start --------------------------------------------------------------------------------
    def start(self):
        """Everything started, or, where something failed, everything stopped again."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self):
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.folder, sub))
        os.chmod(os.path.join(self.folder, "munge"), 0o700)
        key = os.path.join(self.folder, "munge", "key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.network.create()
        with open(os.path.join(self.folder, "hosts"), "w") as f:  # every node's /etc/hosts
            f.write("127.0.0.1 localhost\n" + "".join(
                "%s %s\n" % (self.network.address(n), n) for n in NODES))
        nodes = "\n".join("NodeName=%s NodeAddr=%s %s" % (n, self.network.address(n), node_line())
                          for n in NODES)
        with open(self.conf, "w") as f:
            f.write(CONFIG.format(folder=self.folder, head=NODES[0],
                                  head_address=self.network.address(NODES[0]), nodes=nodes,
                                  node_list=",".join(NODES)))
        munge = os.path.join(self.folder, "munge")
        self.daemon("munged", ["munged", "--foreground", "--force", "--key-file", key,
                               "--socket", munge + "/socket", "--pid-file", munge + "/pid",
                               "--log-file", munge + "/log", "--seed-file", munge + "/seed"])
        self.wait_for(lambda: os.path.exists(munge + "/socket"), 30, "munged's socket")
        self.daemon("slurmctld", self.on_node(NODES[0], ["slurmctld", "-D", "-f", self.conf]))
        for node in NODES:
            self.daemon("slurmd " + node, self.on_node(node, ["slurmd", "-D", "-f", self.conf]))
        self.wait_for(self.nodes_idle, 60, "every node idle in sinfo")

    def on_node(self, node, command):
        """command as run on node: its network, its host name, its /etc/hosts (bound over the
        system's only inside a mount namespace of its own)."""
        return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && hostname "$1" && net=$2 && shift 2 && '
                'exec nsenter --net="$net" "$@"',
                os.path.join(self.folder, "hosts"), node, self.netns(node)] + command

    def netns(self, node):
        return "/run/netns/" + self.network.namespace(node)

    def daemon(self, name, command):
        log = open(os.path.join(self.folder, "log", name.replace(" ", "-") + ".out"), "w")
        self.daemons.append((name, subprocess.Popen(command, stdout=log, stderr=log,
                                                    stdin=subprocess.DEVNULL)))
        log.close()

    def wait_for(self, ready, timeout, what):
        deadline = time.time() + timeout
        while not ready():
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError("%s exited with %s while waiting for %s; see %s/log"
                                       % (name, proc.returncode, what, self.folder))
            if time.time() > deadline:
                raise RuntimeError("no %s within %d s; see %s/log" % (what, timeout, self.folder))
            time.sleep(0.2)

    def nodes_idle(self):
        out = self.command(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split()
        return sorted(out[1::2]) == ["idle"] * len(NODES)

    # --- commands and jobs --------------------------------------------------------------------
    def environment(self, env=None):
        """The tests' environment (TF_CONFIG left out) with this Slurm's configuration, the
        tests' Python for the jobs, and env (a value None: the variable removed)."""
        return environment_without_tf_config(dict(
            {"SLURM_CONF": self.conf, "PYTHON": sys.executable}, **(env or {})))

    def command(self, args, env=None, check=True, timeout=30):
        """A Slurm command run from the head node's network, as a user on it would."""
        done = subprocess.run(["nsenter", "--net=" + self.netns(NODES[0])] + list(args),
                              env=self.environment(env), capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0 or not check, "%s: %s" % (" ".join(args), done.stderr)
        return done

    def submit(self, folder, example, sbatch_options, script_args=(), train_args=(), env=None,
               log_dir=None):
        """sbatch train.sbatch EXAMPLE SCRIPT_ARGS -- --log_dir LOG_DIR TRAIN_ARGS, from the
        repository root; its output file in folder, and its log directory unless given (the
        job's processes all name folder on their command lines). Returns the Job."""
        os.makedirs(folder, exist_ok=True)
        log_dir = log_dir or os.path.join(folder, "logs")
        submitted_at = time.time()
        done = self.command(["sbatch", "--parsable", "--chdir", ROOT, "--output",
                             os.path.join(folder, "slurm-%j.out")] + list(sbatch_options)
                            + [TRAIN_SBATCH, example] + list(script_args)
                            + ["--", "--log_dir", log_dir] + list(train_args), env=env)
        return Job(self, done.stdout.strip().split(";")[0], folder, log_dir, submitted_at)

    # --- stop ---------------------------------------------------------------------------------
    def processes_on_nodes(self):
        """(pid, command line) of every process in a node's network namespace but the daemons
        and their own children (slurmctld's slurmscriptd): the jobs' (slurmstepd and below)."""
        namespaces = set()
        for node in NODES:
            try:
                namespaces.add(os.stat(self.netns(node)).st_ino)
            except OSError:
                pass
        daemons = {proc.pid for _, proc in self.daemons}
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat("/proc/%s/ns/net" % pid).st_ino not in namespaces:
                    continue
                with open("/proc/%s/stat" % pid) as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                if int(pid) in daemons or parent in daemons:
                    continue
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    found.append((int(pid), f.read().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                continue  # gone meanwhile
        return found

    def stop(self):
        """Cancel every job, stop every daemon, kill what is left (noted in self.left), delete
        the namespaces and the folder."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self.daemons):
            self.command(["scancel", "--user", "root"], check=False)
            deadline = time.time() + 60
            while self.processes_on_nodes() and time.time() < deadline:
                time.sleep(0.2)
        for name, proc in reversed(self.daemons):  # the nodes, the controller, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    self.left.append((proc.pid, name + " (did not end on SIGTERM)"))
        self.daemons = []
        for pid, cmdline in self.processes_on_nodes() + processes_mentioning(self.folder):
            try:
                os.kill(pid, signal.SIGKILL)
                self.left.append((pid, cmdline))
            except OSError:
                pass
        self.network.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


class Job(object):
    """One submitted job: its state as scontrol shows it, its output file, its end."""

    def __init__(self, slurm, job_id, folder, log_dir, submitted_at):
        self.slurm, self.id, self.folder, self.log_dir = slurm, job_id, folder, log_dir
        self.submitted_at, self.ended_at = submitted_at, None
        self.output_file = os.path.join(folder, "slurm-%s.out" % job_id)

    def fields(self):
        out = self.slurm.command(["scontrol", "show", "job", "-o", self.id]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, timeout):
        """Until Slurm says the job has ended (at most timeout s); returns its fields, and
        sets ended_at and seconds (from sbatch to the end, to a quarter of a second)."""
        deadline = time.time() + timeout
        while True:
            fields = self.fields()
            if fields["JobState"] in ENDED:
                self.ended_at = time.time()
                self.seconds = self.ended_at - self.submitted_at
                self.state, self.exit_code = fields["JobState"], fields["ExitCode"]
                return fields
            if time.time() > deadline:
                self.slurm.command(["scancel", self.id], check=False)
                raise AssertionError("job %s did not end within %d s (%s); output:\n%s" % (
                    self.id, timeout, fields["JobState"], self.output()[-3000:]))
            time.sleep(0.25)

    def output(self):
        try:
            with open(self.output_file, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def lines(self):
        return self.output().splitlines()

    def wait_for_line(self, text, timeout):
        """The first output line containing text, once it is there (at most timeout s)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = [line for line in self.lines() if text in line]
            if found:
                return found[0]
            assert self.fields()["JobState"] not in ENDED, (
                "the job ended with no line containing %r:\n%s" % (text, self.output()[-3000:]))
            time.sleep(0.25)
        raise AssertionError("no line containing %r within %d s:\n%s"
                             % (text, timeout, self.output()[-3000:]))

    def started(self, role):
        """(pid, address, node) of role's train.py, from `[slurm] started ROLE pid=N at ADDRESS
        (task T on NODE)`."""
        line = self.wait_for_line("[slurm] started %s pid=" % role, 60)
        pid, address, node = re.search(r"pid=(\d+) at (\S+) \(task \d+ on (\S+)\)", line).groups()
        return int(pid), address, node

    def ended(self, **more):
        """What the ended job leaves for the tests, as JSON can keep it: its state and exit
        code, the seconds from sbatch to its end, its output, its log directory, what of it was
        still running 5 s after its end (killed: left), and more."""
        return dict(id=self.id, state=self.state, exit_code=self.exit_code, seconds=self.seconds,
                    output=self.output(), log_dir=self.log_dir,
                    left=left_behind(self.folder, grace=5), **more)


class Ended(object):
    """A played job as the tests read it back (the fields of Job.ended as attributes)."""

    def __init__(self, fields):
        self.__dict__.update(fields)

    def lines(self):
        return self.output.splitlines()

    def summary(self, role="worker0"):
        return summary_of(self.output, role)


class SlurmRuns(object):
    """runs.get(name, play) -> Ended: what play(slurm, folder) returned (Job.ended), played once
    in the test run on a Slurm of this process's, started the first time it plays one.

    Under pytest-xdist the tests of one module may run in either process (with pytest 9.2,
    --dist loadgroup no longer keeps a group together: pytest-xdist#1386), so, as DefaultRuns
    does, the first process to ask for a run plays it, holding a lock on it, and leaves it on
    disk for the other: each job is submitted once, whichever process asks."""

    def __init__(self, tmp_path_factory):
        self.folder = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp/popen-gwN: one folder per worker
            self.folder = self.folder.parent
        self.folder = self.folder / "slurm"
        self.folder.mkdir(exist_ok=True)
        self.slurm = None

    def get(self, name, play):
        with open(str(self.folder / name) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            saved = self.folder / name / "ended.json"
            if not saved.exists():
                if self.slurm is None:
                    slurm = Slurm()
                    slurm.start()
                    self.slurm = slurm
                shutil.rmtree(str(self.folder / name), ignore_errors=True)  # a failed try's
                fields = play(self.slurm, str(self.folder / name))
                saved.write_text(json.dumps(fields))
            return Ended(json.loads(saved.read_text()))

    def close(self):
        """Stop this process's Slurm, if it started one; returns what it had to kill."""
        if self.slurm is None:
            return []
        self.slurm.stop()
        return self.slurm.left
