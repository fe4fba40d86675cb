"""Run one example as a cluster of separate hosts on this Linux machine, and count its bytes.

On localhost a message between two tasks costs a small fixed time whatever its size, so a
distributed run is only ever slower than one process and never limited by the network. This
tool gives every parameter server and every worker a host of its own: a network namespace with
its own interface and IP address, all of them joined by a bridge, and optionally a bandwidth
limit on each host's link. The traffic then crosses links that can be slow, and the interface
counters tell how many bytes each host sent and received.

    sudo python benchmarks/cluster.py Hogwild                     # 1 ps + 2 workers, unlimited
    sudo python benchmarks/cluster.py DOWNPOUR --bandwidth 20mbit -- --steps 2000 --window 5
    sudo python benchmarks/cluster.py Sync-SGD --workers 3 --metrics_file sync.json
    sudo python benchmarks/cluster.py DOWNPOUR --cpus 0.4 --workers 3     # hosts of 0.4 core
    sudo python benchmarks/cluster.py DOWNPOUR --stagger 300 --restart worker0@120   # real life

With --cpus C each host also gets a cgroup of its own whose CPU quota caps it at C cores (cgroup
v1's cpu controller, or v2's cpu.max), so that, as on a real cluster, every worker adds
computing power; without it every task shares this machine's cores, and one process is always
the fastest. The hosts may take at most the machine's cores in all (hosts x C); the report
names the quota and the CPU seconds each host used. The groups are removed at the end.

On a real cluster the tasks do not start together: pods are scheduled one by one and pull their
image first, and a pod that fails comes back under the same name. --stagger S starts each task
after a random delay of up to S seconds (drawn with --seed, and printed), and --restart ROLE@T
kills that task's process T seconds after the first start and starts it again at once, at the
same address, as a pod's restart policy would. --restart ROLE@stepN does it once a task's
progress line first reports global_step N or more (after every timed start and restart, and
once every task restarted before it is back: a worker's "training started", a ps's "serving"):
a restart at a point of the training, however fast this machine trains or a task starts.
--restart_failed N starts a task that exits with an error again (N times in all), as the
restart policy OnFailure does: a worker whose step hangs exits after train.py's --watchdog and
comes back.

Everything after `--` goes to every train.py. Each task runs as
`ip netns exec <namespace> python EXAMPLE/train.py ARGS`, configured only through TF_CONFIG, the
way a task on a real multi-machine cluster is. The output is run.sh's: each line starts with its
task's role ([ps0], [worker1]) and the tool's own lines with [cluster]. After the run comes the
report: the bytes each host sent and received, the bytes per mini-batch, and with a bandwidth
set, the bandwidth bound (the mini-batches per second the busiest link allows, were it busy all
the time) and how close the run came to it. The last line, `[cluster] summary key=value ...`,
holds the same figures for scripts. --metrics_file writes a JSON of the chief's metrics, read
from its summary line and its TensorBoard events in --log_dir (benchmarks/example_runs.py,
metrics_of: the summary's fields and the history of its test metrics), with this report under
"cluster".

The tasks are the ones the example's TF_CONFIG names (deploy/manifests.py reads them from its
train.py): ps and workers for the parameter-server examples, whose chief is worker 0; for
ParameterServerStrategy a chief host as well, the coordinator, which prints the summary and whose
end ends its servers; for MultiWorkerMirroredStrategy workers only (no ps: --ps is refused).

The network, all of it made by this tool and removed again when it ends (<pid> is the tool's):

    namespace dtfg<pid>-switch    bridge br0, with one port v-<role> per task
    namespace dtfg<pid>-ps0       lo, and eth0 at 10.77.0.1/16 (the other end of v-ps0)
    namespace dtfg<pid>-worker0   lo, and eth0 at 10.77.0.2/16 (the other end of v-worker0)
    ...

The host's own network namespace is never touched: no interface, address or route is added to
it. The task namespaces have no route beyond their subnet, so a task can reach only its own
loopback and the other tasks of the run (so nothing downloads; the digits and a --data_path
file are read from disk). With --bandwidth, a tbf qdisc limits each link both ways: on eth0 inside the
task's namespace (what the task sends) and on its bridge port inside the switch namespace (what
the task receives). The tool exits with 0 when every task did; 1 when a task failed or the run
timed out; 2 for bad input or a machine that cannot do this; 128+N after signal N (Ctrl-C: 130).
In every case it stops every task it started and deletes every namespace it made (and with them
the veth pairs and the bridge), and every cgroup.

Needs: Linux, root (namespaces and qdiscs), iproute2's `ip` (and `tc` for --bandwidth), and the
examples' own Python packages (TensorFlow) in the Python that runs this script. A run killed
with SIGKILL cannot clean up: `ip netns list` then shows its dtfg<pid>-* namespaces, and
`ip netns delete NAME` removes them.
"""
import argparse
import ipaddress
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from command_line import error, format_rate, parse_rate  # the one-line error, link rates
import example_runs  # the chief's summary line and TensorBoard events, read

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import manifests  # noqa: E402  deploy/manifests.py: the jobs an example's train.py declares

DEFAULT_SUBNET = "10.77.0.0/16"
PORT = 2222  # every task has an address of its own, so they can all use the same port
COMMAND_SECS = 10  # the longest one ip or tc command may take
STOP_GRACE_SECS = 5  # between SIGTERM and SIGKILL when stopping a task
PS_EXIT_SECS = 30  # the servers' time to exit once the run has ended (run.sh allows as long)
POLL_SECS = 0.1
# flags that would override TF_CONFIG, or that the tool passes itself
CLUSTER_FLAGS = ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts", "--chief_host")
OWN_FLAGS = ("--log_dir", "--metrics_file")


class SetupError(Exception):
    """Bad input, or something this machine lacks or refuses: one `error:` line, exit status 2."""


class Interrupted(Exception):
    def __init__(self, signum):
        super(Interrupted, self).__init__(signal.Signals(signum).name)
        self.signum = signum


# ==================================================================================================
# Commands
# ==================================================================================================
def tool_path(name):
    path = shutil.which(name)
    if not path:
        raise SetupError("`%s` (iproute2) was not found on PATH" % name)
    return path


def run_command(command):
    """Run one short command (ip, tc) and return its output; any failure is a SetupError."""
    SIGNALS.check()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_SECS)
    except subprocess.TimeoutExpired:
        raise SetupError("`%s` took more than %d s" % (" ".join(command), COMMAND_SECS))
    except OSError as e:
        raise SetupError("cannot run `%s`: %s" % (command[0], e))
    SIGNALS.check()  # a Ctrl-C reaches the command too: report the signal, not its failure
    if done.returncode != 0:
        raise SetupError("`%s` failed: %s" % (" ".join(command),
                                               done.stderr.strip() or "exit %d" % done.returncode))
    return done.stdout


def check_machine(needs_tc):
    """Root, ip, and tc when a bandwidth is to be set: what every later step relies on."""
    if sys.platform != "linux":
        raise SetupError("network namespaces need Linux")
    if os.geteuid() != 0:
        raise SetupError("creating network namespaces needs root: run it with sudo")
    tool_path("ip")
    if needs_tc:
        tool_path("tc")


# ==================================================================================================
# The network: a switch namespace with a bridge, and one namespace per host
# ==================================================================================================
def tbf_sizes(bits_per_sec):
    """The burst and the queue limit, in bytes, of a token bucket filter at this rate.

    The burst must hold some full-size packets at any rate; at high rates it must also hold
    the tokens that pile up between two kernel timer ticks (4 ms at HZ=250), or the filter
    cannot reach its rate (at 1gbit that is 500 kB). The queue holds 50 ms at the rate on top of
    the burst: enough for TCP to keep the link busy, too little to add seconds of delay on a
    slow link (at 20mbit it is about 157 kB).
    """
    bytes_per_sec = bits_per_sec / 8.0
    burst = max(32 * 1024, int(bytes_per_sec * 0.004))
    return burst, burst + int(bytes_per_sec * 0.05)


def list_namespaces():
    ip = tool_path("ip")
    return {line.split()[0] for line in run_command([ip, "netns", "list"]).splitlines()
            if line.strip()}


def check_subnet_is_free(subnet):
    """Refuse a subnet this machine already uses, so our addresses never stand for real ones."""
    ip = tool_path("ip")
    used = []
    for iface in json.loads(run_command([ip, "-j", "-4", "addr", "show"]) or "[]"):
        for a in iface.get("addr_info", []):
            used.append(ipaddress.ip_network("%s/%s" % (a["local"], a["prefixlen"]), strict=False))
    for route in json.loads(run_command([ip, "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        if route.get("dst") not in (None, "default"):
            used.append(ipaddress.ip_network(route["dst"], strict=False))
    clash = [str(n) for n in used if n.overlaps(subnet)]
    if clash:
        raise SetupError("the subnet %s overlaps %s on this machine: choose a free one with "
                         "--subnet" % (subnet, ", ".join(sorted(set(clash)))))


class Network(object):
    """The namespaces of one run: a switch with a bridge, and one namespace per host.

    Each host has loopback and eth0 at its own address; eth0 is one end of a veth pair whose other
    end, v-<host>, is a port of the bridge br0 in the switch namespace. With a rate, a tbf qdisc
    limits each link both ways. Only namespaces this object tried to create are ever deleted, and
    it refuses to start if one of its names exists already.

        with Network("dtfg123", ["ps0", "worker0"], rate=20 * 10**6) as net:
            net.namespace("ps0"), net.address("ps0"), net.counters("ps0")
    """

    def __init__(self, prefix, hosts, rate=None, subnet=DEFAULT_SUBNET):
        self.prefix, self.hosts, self.rate = prefix, list(hosts), rate
        self.subnet = ipaddress.ip_network(subnet)
        for host in self.hosts:  # the bridge port v-<host> must fit Linux's 15 characters
            if not re.fullmatch(r"[a-z][a-z0-9]{0,12}", host):
                raise SetupError("host name %r: use 1-13 lowercase letters and digits" % host)
        addresses = list(itertools.islice(self.subnet.hosts(), len(self.hosts)))
        if len(addresses) < len(self.hosts):
            raise SetupError("the subnet %s has no room for %d hosts" % (subnet, len(self.hosts)))
        self.addresses = {h: str(a) for h, a in zip(self.hosts, addresses)}
        self.switch = prefix + "-switch"
        self.attempted = []  # namespaces this run tried to create: the only ones it removes
        self.hosts_files = []  # /etc/netns/<namespace>/ folders this run wrote

    def name_hosts(self, names):
        """Give every host the names in names (host: DNS name): ip netns exec mounts
        /etc/netns/<namespace>/hosts over /etc/hosts inside each namespace."""
        text = "127.0.0.1 localhost\n" + "".join(
            "%s %s\n" % (self.address(h), names[h]) for h in self.hosts)
        if not os.path.isdir("/etc/netns"):
            self.hosts_files.append("/etc/netns")  # made here, so removed here (last)
        for host in self.hosts:
            folder = os.path.join("/etc/netns", self.namespace(host))
            self.hosts_files.insert(0, folder)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write(text)

    def namespace(self, host):
        return "%s-%s" % (self.prefix, host)

    def address(self, host):
        return self.addresses[host]

    def __enter__(self):
        try:
            self.create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()

    def create(self):
        ip = tool_path("ip")
        tc = tool_path("tc") if self.rate else None
        check_subnet_is_free(self.subnet)
        names = [self.switch] + [self.namespace(h) for h in self.hosts]
        taken = sorted(set(names) & list_namespaces())
        if taken:
            raise SetupError("namespace(s) %s exist already, perhaps from a run that was killed: "
                             "remove them with `ip netns delete NAME`" % ", ".join(taken))
        self._add_namespace(self.switch)
        # no IPv6 addresses anywhere (addrgenmode none): their chatter would count as traffic
        run_command([ip, "-n", self.switch, "link", "add", "name", "br0", "type", "bridge"])
        run_command([ip, "-n", self.switch, "link", "set", "dev", "br0", "addrgenmode", "none",
                     "up"])
        for host in self.hosts:
            ns, port = self.namespace(host), "v-" + host
            self._add_namespace(ns)
            run_command([ip, "-n", ns, "link", "set", "dev", "lo", "up"])
            # both ends are made where they live: the host's namespace never sees them
            run_command([ip, "-n", self.switch, "link", "add", "name", port, "type", "veth",
                         "peer", "name", "eth0", "netns", ns])
            run_command([ip, "-n", self.switch, "link", "set", "dev", port, "addrgenmode", "none",
                         "master", "br0", "up"])
            run_command([ip, "-n", ns, "link", "set", "dev", "eth0", "addrgenmode", "none"])
            run_command([ip, "-n", ns, "addr", "add",
                         "%s/%d" % (self.address(host), self.subnet.prefixlen), "dev", "eth0"])
            run_command([ip, "-n", ns, "link", "set", "dev", "eth0", "up"])
            if self.rate:
                burst, limit = tbf_sizes(self.rate)
                tbf = ["root", "tbf", "rate", "%dbit" % self.rate, "burst", str(burst),
                       "limit", str(limit)]
                # what the host sends queues on its eth0, what it receives on its bridge port
                run_command([tc, "-n", ns, "qdisc", "add", "dev", "eth0"] + tbf)
                run_command([tc, "-n", self.switch, "qdisc", "add", "dev", port] + tbf)

    def _add_namespace(self, name):
        self.attempted.append(name)  # before the command: it may be cut short after it acted
        run_command([tool_path("ip"), "netns", "add", name])

    def counters(self, host):
        """(bytes sent, bytes received) on the host's eth0, from the kernel's interface counters."""
        out = run_command([tool_path("ip"), "-n", self.namespace(host), "-s", "-j", "link", "show",
                           "dev", "eth0"])
        stats = json.loads(out)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def remove(self):
        """Delete the namespaces this run made (their veths and bridge go with them).

        Returns the problems as lines; it never raises, as it runs on the way out of failures."""
        problems = []
        try:
            existing = list_namespaces()
        except SetupError as e:
            return [str(e)]
        for name in reversed(self.attempted):
            if name in existing:
                try:
                    run_command([tool_path("ip"), "netns", "delete", name])
                except SetupError as e:
                    problems.append(str(e))
        for folder in self.hosts_files:  # its own folders, then /etc/netns if it made it
            try:
                os.rmdir(folder) if folder == "/etc/netns" else shutil.rmtree(folder)
            except OSError:
                pass  # gone already, or /etc/netns holds another run's folders now
        self.attempted, self.hosts_files = [], []
        return problems


# ==================================================================================================
# CPU: with --cpus, each host gets a cgroup of its own that caps it at that many cores
# ==================================================================================================
def check_cpus(hosts, cores):
    """Refuse, before anything is made, hosts of cores each that this machine cannot give; else
    (cgroup version, where the quotas are set, where usage is read or None: the same place)."""
    if hosts * cores > os.cpu_count() + 1e-9:
        raise SetupError("%d hosts x %g cores = %g cores, more than this machine's %d: give "
                         "--cpus %g or less" % (hosts, cores, hosts * cores, os.cpu_count(),
                                                os.cpu_count() / hosts))
    if os.path.isfile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):  # v1, as on this machine
        version, limit_root = 1, "/sys/fs/cgroup/cpu"
        cpuacct = "/sys/fs/cgroup/cpuacct"
        usage_root = cpuacct if os.path.isfile(cpuacct + "/cpuacct.usage") else None
    elif "cpu" in read_text("/sys/fs/cgroup/cgroup.controllers").split():  # v2
        version, limit_root, usage_root = 2, "/sys/fs/cgroup", None  # usage: cpu.stat there
    else:
        raise SetupError("--cpus needs a cgroup cpu controller (v1 or v2), and none is here")
    if not os.access(limit_root, os.W_OK):
        raise SetupError("--cpus: %s is not writable: run it as root, on a machine (or "
                         "container) that lets you make cgroups" % limit_root)
    return version, limit_root, usage_root


class CpuQuotas(object):
    """One cgroup per host, capped at `cores` cores by the kernel's CFS quota (quota/period),
    made by this run and removed by it; cgroup v1 (the `cpu` controller, and `cpuacct` to
    measure) or v2 (`cpu.max`, `cpu.stat`), whichever this machine has.

    A task joins its host's group before it execs python, so all its threads are capped. Every
    task on this machine otherwise shares its cores: one process is then always the fastest,
    and only hosts with CPUs of their own show what a cluster gains from more workers."""
    PERIOD_US = 100000

    def __init__(self, prefix, hosts, cores):
        self.prefix, self.hosts, self.cores = prefix, list(hosts), cores
        self.made = []  # the groups this run made: the only ones it removes
        self.version, self.limit_root, self.usage_root = check_cpus(len(self.hosts), cores)

    def group(self, host, root=None):
        return os.path.join(root or self.limit_root, "%s-%s" % (self.prefix, host))

    def create(self):
        if self.version == 2:  # the parent hands the cpu controller to its children
            write_text(os.path.join(self.limit_root, "cgroup.subtree_control"), "+cpu")
        for host in self.hosts:
            for root in filter(None, (self.limit_root, self.usage_root)):
                self.made.append(self.group(host, root))  # before: mkdir may act, then fail
                os.mkdir(self.group(host, root))
            quota = int(self.cores * self.PERIOD_US)
            if self.version == 1:
                write_text(os.path.join(self.group(host), "cpu.cfs_period_us"), self.PERIOD_US)
                write_text(os.path.join(self.group(host), "cpu.cfs_quota_us"), quota)
            else:
                write_text(os.path.join(self.group(host), "cpu.max"),
                           "%d %d" % (quota, self.PERIOD_US))

    def join_command(self, host):
        """A command prefix that puts its process in the host's groups, then execs the rest."""
        procs = " ".join(os.path.join(self.group(host, root), "cgroup.procs")
                         for root in filter(None, (self.limit_root, self.usage_root)))
        return ["sh", "-c", 'for f in %s; do echo $$ > "$f" || exit 125; done; exec "$@"' % procs,
                "sh"]

    def cpu_seconds(self, host):
        """CPU time the host's processes have used since its group was made."""
        if self.usage_root:
            return int(read_text(os.path.join(self.group(host, self.usage_root),
                                              "cpuacct.usage"))) / 1e9
        stat = dict(line.split() for line in read_text(
            os.path.join(self.group(host), "cpu.stat")).splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self):
        """Remove the groups this run made (their processes have ended). Returns the problems
        as lines; it never raises, as it runs on the way out of failures."""
        problems = []
        for group in reversed(self.made):
            deadline = time.time() + 5
            while os.path.isdir(group):
                try:
                    os.rmdir(group)
                except OSError as e:  # busy for a moment after its last process has ended
                    if time.time() > deadline:
                        problems.append("cannot remove %s: %s" % (group, e))
                        break
                    time.sleep(POLL_SECS)  # the pace of the retries
        self.made = []
        return problems


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def write_text(path, value):
    try:
        with open(path, "w") as f:
            f.write(str(value))
    except OSError as e:
        raise SetupError("cannot write %s: %s" % (path, e))



# ==================================================================================================
# Tasks: one train.py per host, its output labelled with its role
# ==================================================================================================
class Console(object):
    """The one writer of every task's lines and the tool's own, so lines never interleave."""

    # TensorFlow's start-up chatter, dropped unless --verbose (the same lines run.sh drops)
    CHATTER = re.compile(r"WARNING: All log messages before absl::InitializeLog"
                         r"|[IW][0-9]{4} [0-9:. ]+[0-9]+ [A-Za-z0-9_]+\.(cc|h):[0-9]+\]"
                         r"|To enable the following instructions: "
                         r"|E[0-9]{4} .*(cuInit|cuda_)")

    # a progress line's global step (train.py's plumbing prints one every --log_every steps)
    GLOBAL_STEP = re.compile(r"\blocal_step=\d+ global_step=(\d+)")

    # a task at work again after a start: a worker's session, a ps's server
    BACK = re.compile(r"\] (training started|serving )")

    def __init__(self, verbose=False):
        self.verbose, self.lock = verbose, threading.Lock()
        self.global_step = 0  # the highest any task has reported: what ROLE@stepN waits for
        self.back = set()  # the roles that have said BACK since they last started
        self.summaries = []  # the tasks' summary lines: the chief's, at its end

    def line(self, role, text):
        if not text.startswith("[%s] " % role):  # train.py labels its own lines already
            text = "[%s] %s" % (role, text)
        with self.lock:
            try:
                print(text, flush=True)
            except (BrokenPipeError, ValueError):
                pass  # nobody reads any more; the run and its clean-up go on

    def say(self, text):
        self.line("cluster", text)

    def relay(self, role, stream):
        for raw in stream:
            text = raw.rstrip("\n")
            reported = self.GLOBAL_STEP.search(text)
            if reported:
                self.global_step = max(self.global_step, int(reported.group(1)))
            if self.BACK.search(text):
                self.back.add(role)
            if "] summary " in text:
                self.summaries.append(text)
            if self.verbose or not self.CHATTER.match(text):
                self.line(role, text)


class Task(object):
    def __init__(self, job, index):
        self.job, self.index, self.role = job, index, "%s%d" % (job, index)
        self.proc = self.reader = self.code = None

    def running(self):
        return self.proc is not None and self.code is None

    def describe_exit(self):
        if self.code is not None and self.code < 0:
            return "%s (killed by %s)" % (self.role, signal.Signals(-self.code).name)
        return "%s (exit %s)" % (self.role, self.code)


def tf_config(cluster, task):
    return json.dumps({"cluster": cluster, "task": {"type": task.job, "index": task.index}})


def start_task(task, network, cluster, train_py, train_args, console, pod=None,
               quotas=None):
    """Start train.py in the task's namespace, in a process group of its own, TF_CONFIG only
    (with a deployment, the environment and program that its manifest gives the pod)."""
    SIGNALS.check()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if pod:
        env.update(pod["env"])
        program = os.path.join(ROOT, pod["program"])
    else:
        env["TF_CONFIG"] = tf_config(cluster, task)
        program = train_py
    # sh joins the host's cgroup and execs ip, which enters the namespace (where /sys is
    # remounted: no cgroups in sight) and execs python: the PID is train.py's own
    quota = quotas.join_command(task.role) if quotas else []
    command = quota + [tool_path("ip"), "netns", "exec", network.namespace(task.role),
                       sys.executable, program] + list(train_args)
    task.proc = subprocess.Popen(command, cwd=os.path.dirname(train_py), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace", start_new_session=True)
    task.reader = threading.Thread(target=console.relay, args=(task.role, task.proc.stdout),
                                   daemon=True)
    task.reader.start()
    console.say("started %s pid=%d in namespace %s at %s" % (
        task.role, task.proc.pid, network.namespace(task.role),
        cluster[task.job][task.index]))


def deployment_pods(deployment, train_py, counts):
    """Each task's pod as deploy/manifests.py describes it (--pods), by role: its host name, its
    environment and its program. The manifests own what a pod gets; this only runs it."""
    example = os.path.basename(os.path.dirname(train_py))
    command = [sys.executable, os.path.join(ROOT, "deploy", "manifests.py"), example,
               "--kind", deployment, "--image", "emulated", "--workers", str(counts["worker"]),
               "--pods"] + (["--ps", str(counts["ps"])] if "ps" in counts else [])
    described = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_SECS)
    if described.returncode != 0:
        raise SetupError("deploy/manifests.py: " + described.stderr.strip().splitlines()[-1])
    return {"%s%d" % (pod["job"], pod["index"]): pod for pod in json.loads(described.stdout)}


def reap(tasks):
    """Record the exit of every task that has ended; return the ones that failed just now."""
    failed = []
    for task in tasks:
        if task.running() and task.proc.poll() is not None:
            task.code = task.proc.returncode
            if task.code != 0:
                failed.append(task)
    return failed


def supervise(tasks, console, deadline, keep_going, start, schedule, at_steps=(),
              restart_failed=0):
    """Start and restart the tasks as schedule says (start_schedule's events, with start(task)
    to start one), then restart them at the global steps of at_steps (step_schedule's, as
    console reads the progress lines); wait for the tasks whose end is the run's end, then for
    the servers; return the failures.

    The run ends with the workers, or with the coordinator (chief) where there is one; the
    others (the parameter servers, and a coordinator's workers) exit by themselves soon after.
    A failed task stops the cluster, unless keep_going: then only a failed ps or coordinator
    does (nothing can go on without it), and the other workers finish, as with run.sh. A task
    killed to be restarted is not a failure: its new process is what counts. restart_failed: how
    many times in all a task that fails is started again instead, as a restart policy of
    OnFailure would (a worker's watchdog exits when its step hangs, for this).
    """
    failed, pending, first_start = [], list(schedule), time.time()
    at_steps = list(at_steps)
    by_role = {t.role: t for t in tasks}
    leaders = [t for t in tasks if t.job == ending_job(t.job for t in tasks)]
    restarted = []  # a restart at a step waits for these to be back (a slow start, a loaded host)

    def restart(task, when):
        if not task.running():
            console.say("restart %s %s: it has already ended (%s)"
                        % (task.role, when, task.describe_exit()))
            return
        stop_tasks([task], signals=(signal.SIGKILL,))
        console.say("restart %s %s: killed; starting it again" % (task.role, when))
        console.back.discard(task.role)
        restarted.append(task.role)
        start(task)

    while pending or any(t.running() for t in leaders):
        SIGNALS.check()
        for task in reap(tasks):  # reaped first, so that an ended task is not restarted
            if restart_failed > 0:
                restart_failed -= 1
                console.say("%s failed: starting it again (--restart_failed: %d more)"
                            % (task.describe_exit(), restart_failed))
                task.code = None
                start(task)
            else:
                failed.append(task.describe_exit())
        while pending and time.time() - first_start >= pending[0][0]:
            seconds, kind, role = pending.pop(0)
            if kind == "restart":
                restart(by_role[role], "at +%.0f s" % seconds)
            else:
                start(by_role[role])
        while not pending and at_steps and console.global_step >= at_steps[0][0] and all(
                role in console.back for role in restarted):
            step, role = at_steps.pop(0)
            restart(by_role[role], "at global step %d (+%.0f s)"
                    % (step, time.time() - first_start))
        if failed and (not keep_going or any(f.startswith(("ps", "chief")) for f in failed)):
            console.say("failed: %s; stopping the cluster" % ", ".join(failed))
            return failed
        if time.time() > deadline:
            console.say("the run timed out (--timeout); stopping the cluster")
            return failed + ["timeout"]
        time.sleep(POLL_SECS)
    for step, role in at_steps:
        console.say("restart %s at global step %d: not reached, the run ended first"
                    % (role, step))
    # the servers exit by themselves once the run has ended; bound that wait
    servers_deadline = min(deadline, time.time() + PS_EXIT_SECS)
    while any(t.running() for t in tasks):
        SIGNALS.check()
        failed += [t.describe_exit() for t in reap(tasks)]
        alive = [t.role for t in tasks if t.running()]
        if alive and time.time() > servers_deadline:
            console.say("%s did not exit %d s after the %s" % (", ".join(alive), PS_EXIT_SECS,
                        "coordinator" if leaders[0].job == "chief" else "workers"))
            return failed + ["%s (did not exit)" % role for role in alive]
        time.sleep(POLL_SECS)
    return failed


def ending_job(jobs):
    """The job whose tasks' end is the run's end: the coordinator where there is one."""
    return "chief" if "chief" in set(jobs) else "worker"


def stop_tasks(tasks, signals=(signal.SIGTERM, signal.SIGKILL)):
    """SIGTERM to the process group of every task still running, SIGKILL after STOP_GRACE_SECS
    (signals=(signal.SIGKILL,): at once, as a crash would end it)."""
    for sig in signals:
        alive = [t for t in tasks if t.proc is not None and t.proc.poll() is None]
        if not alive:
            break
        for task in alive:
            try:
                os.killpg(task.proc.pid, sig)  # the group of the PID we started, nothing wider
            except ProcessLookupError:
                pass
        deadline = time.time() + STOP_GRACE_SECS
        while time.time() < deadline and any(t.proc.poll() is None for t in alive):
            time.sleep(POLL_SECS)
    for task in tasks:
        if task.reader is not None:
            task.reader.join(5)  # the last lines of a task that ended


class SignalTrap(object):
    """Notes SIGINT, SIGTERM and SIGHUP; the tool raises Interrupted at points of its choosing.

    The handler itself never raises: an exception thrown into whatever the main thread is doing
    can leave a lock taken (in subprocess or print) and hang the clean-up. Instead every command,
    every poll of the tasks and every start of one calls check(), which raises Interrupted once,
    for the first signal, unless the clean-up has begun, which nothing may cut short.
    """
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.received, self.raising, self.previous = None, False, {}

    def install(self):
        self.received, self.raising = None, True
        self.previous = {s: signal.signal(s, self.note) for s in self.SIGNALS}

    def note(self, signum, frame):
        self.received = self.received or signum

    def check(self):
        if self.received and self.raising:
            self.raising = False
            raise Interrupted(self.received)

    def stop_raising(self):
        self.raising = False

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}


# the tool's one trap; as a library (the tests' Network) it is not installed and never raises
SIGNALS = SignalTrap()


# ==================================================================================================
# The report: bytes on the wire and the bandwidth bound
# ==================================================================================================
def megabytes(n):
    return "%.2f MB" % (n / 1e6)


def traffic_report(roles, before, after, summary, rate):
    """Bytes per host and per mini-batch, the busiest link, and the bandwidth bound.

    The bound: the busiest link must carry its bytes in its busier direction, which takes at
    least bytes / rate; all the run's mini-batches in that time is the most the bandwidth allows.
    The bytes include the set-up, evaluations and shutdown; the achieved rate (the chief's
    steps_per_sec) counts only the training loop, so the fraction is if anything too high.
    summary: the chief's summary line's fields (None: it printed none).
    """
    hosts = {}
    for role in roles:
        sent, received = (a - b for a, b in zip(after[role], before[role]))
        hosts[role] = {"sent_bytes": sent, "received_bytes": received}
    busiest = max(((hosts[r][d], r, d) for r in roles for d in ("sent_bytes", "received_bytes")))
    report = {"bandwidth_bits_per_sec": rate, "hosts": hosts,
              "total_bytes": sum(h["sent_bytes"] for h in hosts.values()),
              "busiest_link": {"host": busiest[1], "direction": busiest[2].split("_")[0],
                               "bytes": busiest[0]}}
    if summary and (summary.get("local_steps") or summary.get("mini_batches")):
        # computed by the workers over the whole run, a lost worker's count -1; a coordinator
        # that does not know which worker ran a step (Keras-Fit's) counts them all
        mini_batches = (sum(s for s in summary["local_steps"] if s > 0)
                        if summary.get("local_steps") else summary["mini_batches"])
        report["mini_batches"] = mini_batches
        report["bytes_per_mini_batch"] = report["total_bytes"] / max(mini_batches, 1)
        report["mini_batches_per_sec"] = summary.get("steps_per_sec")
        if rate and busiest[0] > 0:
            report["bound_seconds"] = busiest[0] * 8.0 / rate
            report["bound_mini_batches_per_sec"] = mini_batches / report["bound_seconds"]
            if report["mini_batches_per_sec"] is not None:
                report["fraction_of_bound"] = (report["mini_batches_per_sec"]
                                               / report["bound_mini_batches_per_sec"])
    return report


def print_report(console, report, status):
    console.say("bytes on the wire, from each host's interface counters:")
    for role, h in report["hosts"].items():
        console.say("  %-9s sent %11s   received %11s" % (role, megabytes(h["sent_bytes"]),
                                                          megabytes(h["received_bytes"])))
    link = report["busiest_link"]
    if "mini_batches" in report:
        console.say("total %s for %d mini-batches: %.1f kB per mini-batch"
                    % (megabytes(report["total_bytes"]), report["mini_batches"],
                       report["bytes_per_mini_batch"] / 1e3))
    else:
        console.say("total %s (no summary from the chief: no figures per mini-batch)"
                    % megabytes(report["total_bytes"]))
    if "bound_mini_batches_per_sec" in report:
        console.say("busiest link: %s %s %s (%.1f kB per mini-batch); at %s that takes at "
                    "least %.1f s, so the bandwidth bound is %.1f mini-batches/s" % (
                        link["host"], link["direction"], megabytes(link["bytes"]),
                        link["bytes"] / 1e3 / report["mini_batches"],
                        format_rate(report["bandwidth_bits_per_sec"]), report["bound_seconds"],
                        report["bound_mini_batches_per_sec"]))
    if "fraction_of_bound" in report:
        console.say("achieved %.1f mini-batches/s: %.2f of the bandwidth bound"
                    % (report["mini_batches_per_sec"], report["fraction_of_bound"]))
    keys = ("mini_batches", "mini_batches_per_sec", "total_bytes", "bytes_per_mini_batch",
            "bound_mini_batches_per_sec", "fraction_of_bound")
    pairs = ["exit=%d" % status, "bandwidth=%s" % (report["bandwidth_bits_per_sec"] or "unlimited"),
             "busiest_host=%s" % link["host"], "busiest_direction=%s" % link["direction"],
             "busiest_bytes=%d" % link["bytes"]]
    pairs += ["%s=%.6g" % (k, report[k]) for k in keys if report.get(k) is not None]
    pairs.append("cpus_per_host=%s" % report.get("cpus_per_host", "shared"))
    cpu = {k[len("cpu_seconds_"):]: v for k, v in report.items() if k.startswith("cpu_seconds_")}
    if cpu:
        console.say("CPU seconds used, per host (each capped at %s cores): %s" % (
            report["cpus_per_host"], ", ".join("%s %.1f" % kv for kv in cpu.items())))
    console.say("summary " + " ".join(pairs))


# ==================================================================================================
# main
# ==================================================================================================
def find_train_py(example):
    """EXAMPLE: a folder of this repository (Hogwild) or a path to one; its train.py and the
    jobs its TF_CONFIG names (ps and worker; chief, ps and worker; or worker alone)."""
    folder = example if os.path.isdir(example) else os.path.join(ROOT, example)
    train_py = os.path.abspath(os.path.join(folder, "train.py"))
    if not os.path.isfile(train_py):
        raise SetupError("%s has no train.py: give an example folder such as Hogwild" % example)
    jobs = manifests.declared_jobs(train_py)
    if not jobs:
        raise SetupError("%s/train.py is not distributed: it does not read TF_CONFIG"
                         % example)
    return train_py, jobs


def task_counts(jobs, ps, workers, example):
    """How many tasks of each job: --ps and --workers, and one coordinator if the example has
    one. An example without parameter servers refuses --ps rather than start none silently."""
    if "ps" not in jobs and ps is not None:
        raise SetupError("%s has no parameter servers: leave out --ps" % example)
    given = {"chief": 1, "ps": 1 if ps is None else ps, "worker": workers}
    return {job: given[job] for job in ("ps", "worker", "chief") if job in jobs}


def positive_cores(text):
    try:
        cores = float(text)
    except ValueError:
        cores = 0
    if not cores > 0:
        raise argparse.ArgumentTypeError("%r is not a number of cores above 0, such as 0.4" % text)
    return cores


def describe_cpus(cpus):
    if not cpus:
        return "shared (every host uses this machine's cores)"
    return "%g core(s) per host (a cgroup CPU quota of its own)" % cpus


def describe_counts(counts):
    """1 ps + 2 worker(s), with + 1 chief (coordinator) where there is one."""
    parts = ["%d ps" % counts["ps"]] if "ps" in counts else []
    parts.append("%d worker(s)" % counts["worker"])
    if "chief" in counts:
        parts.append("%d chief (coordinator)" % counts["chief"])
    return " + ".join(parts)


def check_train_args(train_args):
    for arg in train_args:
        flag = arg.split("=", 1)[0]
        if flag in CLUSTER_FLAGS:
            raise SetupError("%s after --: the tool sets each task's role through TF_CONFIG"
                             % flag)
        if flag in OWN_FLAGS:
            raise SetupError("give %s to cluster.py itself, before --" % flag)


def start_schedule(roles, stagger, seed, restarts):
    """When each task starts and restarts, in seconds after the first start: [(seconds, kind,
    role)] in order, kind "start" or "restart". restarts: ROLE@T texts (ROLE@stepN ones are
    step_schedule's); a bad one raises SetupError."""
    rng = random.Random(seed)
    events = [(round(rng.uniform(0, stagger), 1) if stagger else 0.0, "start", role)
              for role in roles]
    for text in restarts:
        role, seconds, step = parse_restart(text, roles)
        if step is None:
            events.append((seconds, "restart", role))
    return sorted(events, key=lambda e: (e[0], e[1] == "restart"))


def step_schedule(roles, restarts):
    """The restarts at a global step, [(step, role)] in order of step, from the ROLE@stepN
    texts of restarts; a bad text raises SetupError."""
    events = []
    for text in restarts:
        role, _, step = parse_restart(text, roles)
        if step is not None:
            events.append((step, role))
    return sorted(events)


def parse_restart(text, roles):
    """(role, seconds, step) from ROLE@SECONDS or ROLE@stepN (one of seconds and step is None);
    SetupError if it names no task of the run or no time."""
    role, _, at = text.partition("@")
    seconds = step = None
    try:
        if at.startswith("step"):
            step = int(at[len("step"):])
        else:
            seconds = float(at)
    except ValueError:
        pass
    if role not in roles or not ((seconds is not None and seconds >= 0)
                                 or (step is not None and step > 0)):
        raise SetupError("--restart %s: give ROLE@SECONDS or ROLE@stepN with ROLE one of %s, "
                         "such as worker0@60 or worker0@step2000" % (text, ", ".join(roles)))
    return role, seconds, step


def count(text):
    n = int(text)
    if not 1 <= n <= 100:
        raise argparse.ArgumentTypeError("must be 1 to 100, got %d" % n)
    return n


def parser():
    p = argparse.ArgumentParser(
        prog="cluster.py", usage="%(prog)s EXAMPLE [options] [-- train.py args...]",
        description="Run an example's train.py as a cluster of hosts, each task in a network "
                    "namespace of its own joined by a bridge, and report the bytes on the wire "
                    "and the bandwidth bound. Needs root and iproute2 (ip; tc for --bandwidth). "
                    "Arguments after -- go to every train.py.")
    p.add_argument("example", help="an example folder whose train.py reads TF_CONFIG "
                                   "(Hogwild, DOWNPOUR, EASGD, DiLoCo, ..., "
                                   "ParameterServerStrategy, MultiWorkerMirroredStrategy)")
    p.add_argument("--ps", type=count, default=None,
                   help="parameter servers (default: 1; not for an example without any)")
    p.add_argument("--workers", type=count, default=2, help="workers (default: 2)")
    p.add_argument("--bandwidth", type=parse_rate, default=None, metavar="RATE",
                   help="limit each host's link to RATE both ways, in tc's units: 20mbit, "
                        "1gbit, 500kbit; or unlimited (default: unlimited)")
    p.add_argument("--cpus", type=positive_cores, default=None, metavar="C",
                   help="cap each host at C cores (0.4, 1) by a cgroup CPU quota of its own, as "
                        "if each were a machine of its own (default: the hosts share the cores)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds the whole run may take before every task is stopped "
                        "(default: 600)")
    p.add_argument("--keep-going", action="store_true",
                   help="when a worker fails, let the other tasks finish as run.sh does "
                        "(default: stop the cluster at the first failed task; a failed ps "
                        "always stops it)")
    p.add_argument("--log_dir", default="",
                   help="passed to train.py: checkpoints and TensorBoard summaries (default: a "
                        "temporary folder, deleted at the end)")
    p.add_argument("--metrics_file", default="",
                   help="JSON file to write: the chief's metrics (its summary line's fields and "
                        "the history of its test metrics, from its TensorBoard events in "
                        "--log_dir) plus this tool's report under the key 'cluster'; "
                        "overwritten (default: none)")
    p.add_argument("--subnet", type=ipaddress.ip_network, default=DEFAULT_SUBNET,
                   help="IPv4 subnet of the hosts' addresses; must be unused on this machine "
                        "(default: %s)" % DEFAULT_SUBNET)
    p.add_argument("--stagger", type=float, default=0, metavar="S",
                   help="start each task after a random delay of 0 to S seconds, as pods start "
                        "on a real cluster (default: 0, all at once)")
    p.add_argument("--seed", type=int, default=0, help="seed of --stagger's delays (default: 0)")
    p.add_argument("--restart", action="append", default=[], metavar="ROLE@T",
                   help="kill task ROLE (worker0, ps0) T seconds after the first task started, "
                        "and start it again at once at the same address; ROLE@stepN: once a "
                        "progress line reports global_step N or more; may be repeated")
    p.add_argument("--restart_failed", type=int, default=0, metavar="N",
                   help="start a task that exits with an error again, N times in all at most, "
                        "as a pod's restart policy OnFailure would (default: 0, a failed task "
                        "fails the run)")
    p.add_argument("--verbose", action="store_true", help="keep TensorFlow's start-up log lines")
    p.add_argument("--deployment", choices=("tfjob", "plain"), default=None,
                   help="run each task as its pod in deploy/manifests.py's manifest would run: "
                        "the host names and TF_CONFIG a TFJob operator gives it, or plain "
                        "Kubernetes' entrypoint (default: IP addresses in TF_CONFIG)")
    p.error = lambda message: sys.exit(error("%s (see python benchmarks/cluster.py --help)"
                                             % message))
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, train_args = parser().parse_args(argv[:split]), argv[split + 1:]
    try:
        train_py, jobs = find_train_py(args.example)
        counts = task_counts(jobs, args.ps, args.workers, args.example)
        check_train_args(train_args)
        if args.stagger < 0:
            raise SetupError("--stagger must be 0 or more seconds, got %g" % args.stagger)
        if args.restart_failed < 0:
            raise SetupError("--restart_failed must be 0 or more, got %d" % args.restart_failed)
        start_schedule([Task(job, i).role for job, n in counts.items() for i in range(n)],
                       args.stagger, args.seed, args.restart)  # a bad --restart fails here
        if args.cpus:  # refuses, before anything is made, what this machine cannot give
            check_cpus(sum(counts.values()), args.cpus)
        check_machine(needs_tc=args.bandwidth is not None)
    except SetupError as e:
        return error(str(e))
    return run_cluster(args, train_py, train_args, counts)


def run_cluster(args, train_py, train_args, counts):
    console = Console(args.verbose)
    tasks = [Task(job, i) for job, n in counts.items() for i in range(n)]
    roles = [t.role for t in tasks]
    scratch = tempfile.mkdtemp(prefix="dtfg-cluster-")
    log_dir = os.path.abspath(args.log_dir) if args.log_dir else os.path.join(scratch, "logs")
    metrics_file = os.path.abspath(args.metrics_file) if args.metrics_file else None
    if metrics_file and os.path.exists(metrics_file):
        os.remove(metrics_file)  # a failed run must not leave an earlier run's figures behind
    train_args = list(train_args) + ["--log_dir", log_dir]
    status, network, quotas = 1, None, None

    def clean_up():
        stop_tasks(tasks)
        for problem in (network.remove() if network else []) + (
                quotas.remove() if quotas else []):
            console.say("clean-up: " + problem)

    def run():
        nonlocal network, quotas
        network = Network("dtfg%d" % os.getpid(), roles, args.bandwidth, args.subnet)
        console.say("%s of %s, each in a namespace %s-<role> on %s, links %s, CPU %s"
                    % (describe_counts(counts), os.path.basename(os.path.dirname(train_py)),
                       network.prefix, network.subnet, format_rate(args.bandwidth),
                       describe_cpus(args.cpus)))
        if args.cpus:
            quotas = CpuQuotas(network.prefix, roles, args.cpus)
            quotas.create()
        network.create()
        names = {t.role: network.address(t.role) for t in tasks}
        pods = {}
        if args.deployment:
            pods = deployment_pods(args.deployment, train_py, counts)
            names = {role: pod["host"] for role, pod in pods.items()}
            network.name_hosts(names)
        cluster = {job: ["%s:%d" % (names[t.role], PORT) for t in tasks if t.job == job]
                   for job in counts}
        before = {role: network.counters(role) for role in roles}
        deadline = time.time() + args.timeout
        schedule = start_schedule(roles, args.stagger, args.seed, args.restart)
        at_steps = step_schedule(roles, args.restart)
        if args.stagger:
            console.say("staggered start (--seed %d): %s" % (args.seed, ", ".join(
                "%s +%.1f s" % (role, at) for at, kind, role in schedule if kind == "start")))
        start = lambda task: start_task(task, network, cluster, train_py, train_args, console,
                                        pods.get(task.role), quotas)
        failed = supervise(tasks, console, deadline, args.keep_going, start, schedule,
                           at_steps, args.restart_failed)
        stop_tasks(tasks)  # whatever still runs after a failure or a timeout
        after = {role: network.counters(role) for role in roles}
        status = 1 if failed else 0
        console.say("failed: %s" % ", ".join(failed) if failed else "all processes finished")
        chief_output = "\n".join(console.summaries)
        report = traffic_report(roles, before, after, example_runs.summary_fields(chief_output),
                                args.bandwidth)
        report["cpus_per_host"] = args.cpus or "shared"
        if quotas:  # what each host used of its quota
            for role in roles:
                report["cpu_seconds_" + role] = round(quotas.cpu_seconds(role), 3)
        print_report(console, report, status)
        metrics = example_runs.metrics_of(chief_output, log_dir) if metrics_file else None
        if metrics is not None:
            metrics["cluster"] = dict(report, exit=status, namespaces=network.prefix + "-*")
            with open(metrics_file, "w") as f:
                json.dump(metrics, f, indent=1)
        return status

    SIGNALS.install()
    try:
        status = run()
    except SetupError as e:
        status = error(str(e))
    except Interrupted as e:
        console.say("interrupted by %s: stopping every task" % e)
        status = 128 + e.signum
    finally:
        SIGNALS.stop_raising()  # a signal now changes the exit status, not the clean-up
        clean_up()
        shutil.rmtree(scratch, ignore_errors=True)
        SIGNALS.restore()
    if SIGNALS.received and status < 128:
        status = 128 + SIGNALS.received
    return status


if __name__ == "__main__":
    sys.exit(main())
