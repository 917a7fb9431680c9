"""A Ray cluster of several nodes on this one machine, for trying learning.py --ray-address without a second
machine: each node is its own raylet with its own CPUs, as on a real cluster (ray.cluster_utils.Cluster, which Ray
uses for its own multi-node tests). It starts the nodes, runs the command with {address} replaced by the head's
address, and stops the nodes when the command ends.

    python benchmarks/local_cluster.py --nodes 2 --cpus 3 -- \\
        python benchmarks/learning.py --run --ray-address {address} --impls ppo --envs Pendulum-v1 --seeds 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="local_cluster.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default: 2)")
    p.add_argument("--cpus", type=float, default=2, help="CPUs each node offers (default: 2)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command to run, with {address}")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.nodes < 1 or args.cpus <= 0 or not command:
        p.error("give --nodes >= 1, --cpus > 0 and a command after --")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus)
        cluster.wait_for_nodes()
        print(f"local_cluster.py: {args.nodes} nodes x {args.cpus:g} CPUs at {cluster.address}", file=sys.stderr)
        return subprocess.call([part.replace("{address}", cluster.address) for part in command])
    except KeyboardInterrupt:
        return 130
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
