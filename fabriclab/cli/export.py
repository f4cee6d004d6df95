"""`fabriclab export`: a spec's fabric for another tool (no network is built).

    fabriclab export containerlab default --out clab/ [--routing ecmp] [--image fabriclab/lab:latest]
    fabriclab export fabric default [--out fabric.json]          # dpids, ports, cables, addresses
    fabriclab export graph default --format mermaid|dot|drawio [--out FILE]
"""

from __future__ import annotations

import sys

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.export import containerlab, graph


def register(subparsers):
    p = subparsers.add_parser("export", help="write a spec's fabric for another tool (containerlab, a controller "
                                             "of your own, a picture)")
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
    q = sub.add_parser("fabric", help="the fabric as JSON: switches with dpids and ports, hosts with addresses, "
                                      "cables with both ends' port numbers (for a controller of your own)")
    q.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name")
    q.add_argument("--format", choices=("json",), default="json", help="json (the only one today)")
    q.add_argument("--out", default="-", help="file to write (default: standard output)")
    q.set_defaults(func=cmd_fabric)
    q = sub.add_parser("graph", help="a picture source of the fabric: mermaid, Graphviz dot or diagrams.net")
    q.add_argument("spec", metavar="SPEC", help="spec file or shipped spec name")
    q.add_argument("--format", choices=graph.FORMATS, default="mermaid", help="default: mermaid")
    q.add_argument("--out", default="-", help="file to write (default: standard output)")
    q.set_defaults(func=cmd_graph)


def cmd_containerlab(args):
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    fabric = Fabric(load_spec(args.spec))
    path = containerlab.export(fabric, args.out, args.routing, args.image, args.mgmt_subnet)
    print(f"{path}: {len(fabric.switches)} switches, {len(fabric.hosts)} hosts and a controller, "
          f"{len(fabric.links)} links; checked against containerlab's schema. Deploy: "
          f"cd {path.parent} && sudo containerlab deploy -t {path.name}")
    return 0


def _fabric(spec):
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    return Fabric(load_spec(spec))


def _write(text, out):
    if out == "-":
        sys.stdout.write(text)
        return
    from fabriclab.errors import LabError
    from fabriclab.loading import clip

    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise LabError(f"cannot write {clip(out)}: {exc.strerror}") from None
    print(f"{out}: written")


def cmd_fabric(args):
    from fabriclab.export import topology

    _write(topology.to_json(_fabric(args.spec)), args.out)
    return 0


def cmd_graph(args):
    _write(graph.render(_fabric(args.spec), args.format), args.out)
    return 0
