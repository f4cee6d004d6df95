"""A spec's fabric as a picture source in the formats people paste into docs and tools:

    fabriclab export graph default --format mermaid      # a ```mermaid block (GitHub, GitLab, mkdocs)
    fabriclab export graph default --format dot | dot -Tsvg > fabric.svg     # Graphviz
    fabriclab export graph default --format drawio --out fabric.drawio        # diagrams.net

Nodes are the switches and hosts by tier (the live view's layout: super-spines, spines, leaves,
hosts); edges are cables, labelled with their rate where it differs from the host links', and
parallel cables drawn once each. Nothing is built.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import quoteattr

from fabriclab.view.layout import layout

FORMATS = ("mermaid", "dot", "drawio")
# fill colours by tier: the live view's palette
COLOURS = {"super_spine": "#6a3d9a", "spine": "#1f78b4", "leaf": "#33a02c", "host": "#b15928"}
SHAPES = {"super_spine": "box", "spine": "box", "leaf": "box", "host": "ellipse"}
TIER_NAMES = {"super_spine": "super-spines", "spine": "spines", "leaf": "leaves", "host": "hosts"}


def render(fabric, fmt):
    """The fabric in `fmt` (one of FORMATS) as text."""
    return {"mermaid": mermaid, "dot": dot, "drawio": drawio}[fmt](fabric)


def _ident(name):
    """A node id every format accepts (the lab's names are already letters, digits and -)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _edge_label(fabric, link):
    rate = link["rate_mbps"]
    return "" if rate == fabric.spec.host_rate_mbps else f"{rate:g} Mbit/s"


def _downward(view):
    """The view's cables as (upper, lower, link): layered layouts (dot, mermaid) rank an edge's
    first node above its second, so each edge is written from the higher tier down."""
    rank = {"super_spine": 0, "spine": 1, "leaf": 2, "host": 3}
    role = {n["id"]: n["role"] for n in view["nodes"]}
    return [(l["a"], l["b"], l) if rank[role[l["a"]]] <= rank[role[l["b"]]] else (l["b"], l["a"], l)
            for l in view["links"]]


def _tiers(view):
    out = {}
    for node in view["nodes"]:
        out.setdefault(node["role"], []).append(node)
    return out


def mermaid(fabric):
    view = layout(fabric)
    lines = ["```mermaid", "graph TB"]
    for role, nodes in _tiers(view).items():
        lines.append(f"  subgraph tier_{role}[\"{TIER_NAMES[role]}\"]")
        for node in nodes:
            open_, close = ("([", "])") if role == "host" else ("[", "]")
            lines.append(f"    {_ident(node['id'])}{open_}\"{node['id']}\"{close}")
        lines.append("  end")
    for upper, lower, link in _downward(view):
        label = _edge_label(fabric, link)
        arrow = f" ---|\"{label}\"| " if label else " --- "
        lines.append(f"  {_ident(upper)}{arrow}{_ident(lower)}")
    for role, colour in COLOURS.items():
        lines.append(f"  classDef {role} fill:{colour},color:#fff")
    for role, nodes in _tiers(view).items():
        lines.append(f"  class {','.join(_ident(n['id']) for n in nodes)} {role}")
    return "\n".join(lines + ["```", ""])


def dot(fabric):
    view = layout(fabric)
    lines = [f"graph {_ident(fabric.spec.name)} {{", "  rankdir=TB;", "  node [style=filled, fontcolor=white];"]
    for role, nodes in _tiers(view).items():
        lines.append("  { rank=same; " + " ".join(f'"{n["id"]}";' for n in nodes) + " }")
        for node in nodes:
            lines.append(f'  "{node["id"]}" [shape={SHAPES[role]}, fillcolor="{COLOURS[role]}"];')
    for upper, lower, link in _downward(view):
        label = _edge_label(fabric, link)
        lines.append(f'  "{upper}" -- "{lower}"' + (f' [label="{label}"]' if label else "") + ";")
    return "\n".join(lines + ["}", ""])


def drawio(fabric):
    """An uncompressed diagrams.net file: one page, a vertex per node at the view's coordinates."""
    view = layout(fabric)
    scale = 2.0                     # the view's units are tight for drawio's default font
    cells = ['<mxCell id="0"/>', '<mxCell id="1" parent="0"/>']
    for node in view["nodes"]:
        w, h = (60, 30) if node["role"] != "host" else (50, 30)
        shape = "ellipse;" if node["role"] == "host" else "rounded=1;"
        style = f"{shape}whiteSpace=wrap;fillColor={COLOURS[node['role']]};fontColor=#ffffff;"
        cells.append(f'<mxCell id={quoteattr("n-" + node["id"])} value={quoteattr(node["id"])} '
                     f'style={quoteattr(style)} vertex="1" parent="1">'
                     f'<mxGeometry x="{node["x"] * scale - w / 2:.1f}" y="{node["y"] * scale - h / 2:.1f}" '
                     f'width="{w}" height="{h}" as="geometry"/></mxCell>')
    for link in view["links"]:
        cells.append(f'<mxCell id={quoteattr("e-" + link["id"])} value={quoteattr(_edge_label(fabric, link))} '
                     f'style="endArrow=none;" edge="1" parent="1" source={quoteattr("n-" + link["a"])} '
                     f'target={quoteattr("n-" + link["b"])}><mxGeometry relative="1" as="geometry"/></mxCell>')
    name = quoteattr(fabric.spec.name)
    return ("<mxfile host=\"fabriclab\">\n"
            f"<diagram id={name} name={name}><mxGraphModel><root>\n" + "\n".join(cells)
            + "\n</root></mxGraphModel></diagram>\n</mxfile>\n")
