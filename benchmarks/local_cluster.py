"""A Ray cluster of several nodes on this one machine, for trying learning.py --ray-address without a second
machine: each node is its own raylet with its own CPUs, as on a real cluster (ray.cluster_utils.Cluster, which Ray
uses for its own multi-node tests). It starts the nodes, runs the command with {address} replaced by the head's
address, and stops the nodes when the command ends.

    python benchmarks/local_cluster.py --nodes 2 --cpus 3 -- \\
        python benchmarks/learning.py --run --ray-address {address} --impls ppo --envs Pendulum-v1 --seeds 4
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import common  # noqa: F401 (it puts the repository on the path)

from stop_signals import take_back_stop_signals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="local_cluster.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default: 2)")
    p.add_argument(
        "--cpus", type=float, nargs="+", default=[2.0], help="CPUs each node offers, or one value per node (default: 2)"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run, with {address}")
    args = p.parse_args(argv)
    take_back_stop_signals()  # Ctrl-C stops the command and the nodes also when this was started with SIGINT ignored
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cpus = args.cpus * args.nodes if len(args.cpus) == 1 else args.cpus
    if args.nodes < 1 or len(cpus) != args.nodes or min(cpus) < 0 or not command:
        p.error("give --nodes >= 1, --cpus >= 0 (one value, or one per node) and a command after --")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus[0]})
    try:
        for node_cpus in cpus[1:]:
            cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes()
        offered = " + ".join(f"{c:g}" for c in cpus)
        print(f"local_cluster.py: {args.nodes} nodes, {offered} CPUs, at {cluster.address}", file=sys.stderr)
        proc = subprocess.Popen([part.replace("{address}", cluster.address) for part in command])
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the command saves what it can first (a terminal's Ctrl-C reaches it too)
            proc.send_signal(signal.SIGINT)
            proc.wait()
            return 130
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
