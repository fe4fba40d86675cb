"""What the tests share, one module a subject (a test module imports from here, never from
another test module or from conftest.py, which holds the fixtures only):

    examples     the example folders, their train.py loaded as a module, a train.py run alone
    processes    free ports, and no process of a test left running
    runs         bash run.sh started, read line by line, finished, a task killed mid-run; a
                 cluster's tasks started one by one
    checks       what several examples' runs must show: the bar, a push a window, a lost worker
    in_process   a real cluster inside the test process, driven op by op, and references
                 computed apart from the examples
    strategies   one update of a TensorFlow 2 strategy example (strategy_step.py, run apart)
    namespaces   benchmarks/cluster.py's hosts in network namespaces (root, ip and tc)

pytest puts tests/ on sys.path (the folder holds conftest.py and no __init__.py), so a test
module says `from support.runs import finish`.
"""
