"""`fabriclab export containerlab SPEC`: the fabric as a containerlab topology (no network is built).

    fabriclab export containerlab default --out clab/ [--routing ecmp] [--image fabriclab/lab:latest]
"""

from __future__ import annotations

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.export import containerlab


def register(subparsers):
    p = subparsers.add_parser("export", help="write a spec's fabric for another tool (containerlab)")
    sub = p.add_subparsers(dest="export_format", metavar="FORMAT")
    sub.required = True
    q = sub.add_parser("containerlab", help="a containerlab topology (*.clab.yml) of the same fabric, "
                                            "checked against containerlab's schema")
    q.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name")
    q.add_argument("--routing", default=DEFAULT_ROUTING, help=f"the controller app (default: {DEFAULT_ROUTING})")
    q.add_argument("--out", default=".", help="folder for SPEC.clab.yml and run/fabric.json (default: here)")
    q.add_argument("--image", default=containerlab.DEFAULT_IMAGE,
                   help=f"every node's image, built from containerlab/Dockerfile (default {containerlab.DEFAULT_IMAGE})")
    q.add_argument("--mgmt-subnet", default=containerlab.DEFAULT_SUBNET,
                   help=f"the management network (default {containerlab.DEFAULT_SUBNET})")
    q.set_defaults(func=cmd_containerlab)


def cmd_containerlab(args):
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    fabric = Fabric(load_spec(args.spec))
    path = containerlab.export(fabric, args.out, args.routing, args.image, args.mgmt_subnet)
    print(f"{path}: {len(fabric.switches)} switches, {len(fabric.hosts)} hosts and a controller, "
          f"{len(fabric.links)} links; checked against containerlab's schema. Deploy: "
          f"cd {path.parent} && sudo containerlab deploy -t {path.name}")
    return 0
