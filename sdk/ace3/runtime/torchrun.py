"""torchrun for one node of a multi-node job whose processes live in a PID namespace of their own.

torchrun's c10d rendezvous tells nodes apart by ``(address, pid, counter)``. In the job sandbox
every node's torchrun has the same small PID (its namespace is new), so two nodes of one job on
the same machine (two workers of one host, or a test) would look like one node rejoining and the
rendezvous would never fill. ``ACE3_NODE_ID`` (set by the worker: unique among the nodes of the
machine) replaces the PID in the node's descriptor; everything else is torchrun as it is::

    python -m ace3.runtime.torchrun [torchrun arguments]
"""

from __future__ import annotations

import os
import sys


def _distinct_node_descriptors(node_id: int) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    generator = dynamic_rendezvous._NodeDescGenerator
    original = generator.generate

    def generate(self, local_addr=None):  # type: ignore[no-untyped-def]
        desc = original(self, local_addr)
        return dynamic_rendezvous._NodeDesc(desc.addr, node_id, desc.local_id)

    generator.generate = generate  # type: ignore[method-assign]


def main() -> None:
    node_id = os.environ.get("ACE3_NODE_ID", "")
    if node_id.isdigit():
        try:
            _distinct_node_descriptors(int(node_id))
        except (ImportError, AttributeError) as exc:  # (a torch without these internals)
            print(f"ace3: node descriptors left as torchrun makes them ({exc})", file=sys.stderr)
    from torch.distributed.run import main as torchrun

    torchrun()


if __name__ == "__main__":
    main()
