"""Extensions from installed packages, found through entry points:

    [project.entry-points."fabriclab.routing"]
    first-path = "my_package.routing:APP"           # an apps.AppInfo
    [project.entry-points."fabriclab.experiments"]
    first-path-vs-ecmp = "my_package.experiment"    # a module implementing the Experiment protocol
    [project.entry-points."fabriclab.jobs"]
    my-kind = "my_package.job"                      # a module implementing the JobKind protocol

Built-in names win: a plugin cannot replace `ecmp`. The groups are read once a process, and only
when a name is not built in (reading every installed package's metadata takes tens of ms).
"""

from __future__ import annotations

import importlib
import inspect
import re

from fabriclab.errors import LabError
from fabriclab.loading import excerpt

ROUTING = "fabriclab.routing"
EXPERIMENTS = "fabriclab.experiments"
JOBS = "fabriclab.jobs"
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


def names(builtin, group):
    """The built-in names (in their order), then those installed packages add under `group`."""
    return [*builtin, *sorted(n for n in entry_points(group) if n not in builtin)]


def module(name, builtin, group, what):
    """The module `builtin[name]` names (a dotted path), or the one an installed package adds under
    `group`; LabError listing every name for one nobody has. `what` names the thing: "job kind"."""
    if isinstance(name, str) and name in builtin:
        return importlib.import_module(builtin[name])
    mod = load(group, name) if isinstance(name, str) else None
    if mod is None:
        raise LabError(f"unknown {what} {excerpt(name)}: choose one of {', '.join(names(builtin, group))}")
    return mod


def check_protocol(mod, name, protocol, attrs, what, where):
    """`mod` if it defines `attrs` and every method of `protocol` taking as many arguments, and
    calls itself `name` (its NAME); LabError naming what it lacks otherwise."""
    missing = [attr for attr in attrs if not hasattr(mod, attr)]
    methods = [m for m, f in vars(protocol).items() if inspect.isfunction(f) and not m.startswith("_")]
    for method in methods:
        want = len(inspect.signature(getattr(protocol, method)).parameters) - 1
        found = getattr(mod, method, None)
        if not callable(found):
            missing.append(f"{method}()")
        elif len(inspect.signature(found).parameters) != want:
            missing.append(f"{method}() taking {want} arguments")
    if missing:
        raise LabError(f"{what} {name}: module {mod.__name__} lacks {', '.join(missing)} (the "
                       f"{protocol.__name__} protocol, {where})")
    if mod.NAME != name:
        raise LabError(f"{what} {name}: module {mod.__name__} calls itself {excerpt(mod.NAME)}")
    return mod
