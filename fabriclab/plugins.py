"""Extensions from installed packages, found through entry points:

    [project.entry-points."fabriclab.routing"]
    first-path = "my_package.routing:APP"           # an apps.AppInfo
    [project.entry-points."fabriclab.experiments"]
    first-path-vs-ecmp = "my_package.experiment"    # a module implementing the Experiment protocol

Built-in names win: a plugin cannot replace `ecmp`. The groups are read once a process, and only
when a name is not built in (reading every installed package's metadata takes tens of ms).
"""

from __future__ import annotations

import re

from fabriclab.errors import LabError
from fabriclab.loading import excerpt

ROUTING = "fabriclab.routing"
EXPERIMENTS = "fabriclab.experiments"
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
_found = {}


def entry_points(group):
    """{name: EntryPoint} of the group, names that are not well-formed left out."""
    if group not in _found:
        from importlib.metadata import entry_points as installed

        _found[group] = {ep.name: ep for ep in installed(group=group) if NAME.match(ep.name)}
    return _found[group]


def load(group, name):
    """What the entry point `name` of `group` names; None when no installed package has it."""
    ep = entry_points(group).get(name)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as exc:              # noqa: BLE001 - a broken plugin is named, in one line
        where = f" (package {ep.dist.name})" if getattr(ep, "dist", None) else ""
        raise LabError(f"plugin {excerpt(name)}{where} of {group} does not load: {type(exc).__name__}: "
                       f"{str(exc)[:120]}") from None
