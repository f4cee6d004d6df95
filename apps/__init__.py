"""os-ken controller apps: the catalogue of routing schemes a user can name, and their options.

A routing choice is a string, `NAME` or `NAME:option=value,option=value`, e.g. `flowlet:gap_us=500`
or `te:period_s=2`. `choice.Routing.parse` checks it once, where it enters the lab (one-line
errors, without importing os-ken, so a bad choice is refused before anything is built), and
everything below receives that Routing value.

Every app runs in the same controller: the os-ken adapter (osken_app.py) around the controller
core (core.py), composed from the app's AppInfo: its routing class, TE's engine, the per-packet
selection stage, and the flow model's placement that predicts it. To add an app: write a routing
class (desired state as data, see ecmp.py) or reuse one, and register the app in APPS with its
options. Nothing else names it: the controller, the CLI's checks and the flow model read APPS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fabriclab.loading import excerpt


class RoutingError(ValueError):
    """A routing choice that names no app or gives a bad option (the message is one line)."""


@dataclass(frozen=True)
class Option:
    name: str
    kind: type                 # float, int or bool
    default: object
    help: str
    low: float | None = None   # values must be > low (None: no bound)

    def parse(self, app, text):
        if self.kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise RoutingError(f"routing {app}: option {self.name} must be on or off, got {excerpt(text)}")
        try:
            value = self.kind(text)
        except ValueError:
            raise RoutingError(f"routing {app}: option {self.name} must be a number, got {excerpt(text)}") from None
        if self.low is not None and not value > self.low:
            raise RoutingError(f"routing {app}: option {self.name} must be > {self.low:g}, got {text}")
        return value


DEFAULT_ROUTING = "ecmp"            # what a run uses when nothing names an app


class RoutingClass(Protocol):
    """What an app's routing class is (ecmp.py is the model): built from the fabric (and whether
    members are weighted by healthy capacity), it gives every switch's desired state as data; the
    controller core diffs it against the switch and sends the OpenFlow messages."""

    def __init__(self, fabric, weighted=False): ...

    def desired(self, down=frozenset()):
        """{switch name: SwitchState (flows, groups)} with the links in `down` failed."""


@dataclass(frozen=True)
class AppInfo:
    summary: str
    options: tuple = field(default_factory=tuple)
    # The routing class, "module:Class" (imported by the controller only, so that checking a choice
    # needs no os-ken): the desired flows and groups as data.
    routing: str = "fabriclab.apps.ecmp:EcmpRouting"
    te_engine: bool = False        # TE's engine places announced jobs above the routing class's entries
    stage: str | None = None       # the per-packet selection stage's mode (select_stage.py), if any
    model: str | None = None       # the flow model's placement that predicts it (model/placement.py)
    # An os-ken app of one's own ("PATH.py:Class" or "module:Class") that runs instead of the lab's
    # controller core: it publishes no status, so the lab knows it only by its switches' connections.
    osken_app: str | None = None
    # An OpenFlow controller the lab does not start (`tcp:HOST:PORT`): the switches connect to it.
    external: str | None = None

    def defaults(self):
        return {o.name: o.default for o in self.options}

    def routing_class(self):
        """The class `routing` names ("module:Class", or "/path/file.py:Class"), checked to be a
        RoutingClass; RoutingError in one line for one that does not load."""
        import inspect

        module, _, name = self.routing.partition(":")
        try:
            cls = getattr(_import(module), name, None)
        except Exception as exc:           # noqa: BLE001 - the user's code may raise anything
            raise RoutingError(f"routing class {excerpt(self.routing)} does not load: {type(exc).__name__}: "
                               f"{str(exc)[:120]}") from None
        if not inspect.isclass(cls) or not callable(getattr(cls, "desired", None)):
            raise RoutingError(f"routing class {excerpt(self.routing)} is not a class with desired(down) "
                               f"(the RoutingClass protocol, apps/__init__.py)")
        return cls


def _import(module):
    """A module by name, or a .py file by its path (loaded once a process, under a name of its own)."""
    import importlib
    import importlib.util
    import sys

    if not module.endswith(".py"):
        return importlib.import_module(module)
    key = "fabriclab_routing_file_" + "".join(c if c.isalnum() else "_" for c in module)
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, module)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        sys.modules[key] = loaded
    return sys.modules[key]


_SEED = Option("seed", int, 0, "hash seed: with each switch's dpid, its hash basis (the same seed gives the "
                                "same choices)", low=-1)
_SHARED = Option("shared_basis", bool, False, "every switch hashes from one basis: the misconfiguration that "
                                              "makes the same choice at every tier (apps/hashing.py)")
HASHING = (_SEED, _SHARED)          # every app: its select groups (and its stage) hash
_WEIGHTS_ON = Option("weights", bool, True, "weight each member by the healthy capacity behind it (WCMP)")
_WEIGHTS_OFF = Option("weights", bool, False, "weight each member by the healthy capacity behind it (WCMP)")
_LOAD_WINDOW = Option("load_window_us", float, 2000.0,
                      "window of the per-port load estimate (bytes sent in the last 1-2 windows)", low=0)

APPS = {
    "ecmp": AppInfo("ECMP: select groups hashing the 5-tuple, one per destination leaf",
                    (_WEIGHTS_OFF, *HASHING), model="ecmp"),
    "eecmp": AppInfo("E-ECMP: the 5-tuple plus the RoCE BTH destination QP, hashed per packet at "
                     "the switch's egress stage", HASHING, stage="hash", model="eecmp"),
    "flowlet": AppInfo("flowlet switching: a flow idle longer than the gap moves to the least-loaded "
                       "member; new flows start there",
                       (Option("gap_us", float, 10000.0, "flowlet interval (lab time; at 10-20 Mbit/s a packet takes 0.5-1 ms)", low=0),
                        _LOAD_WINDOW,
                        Option("qp", bool, False, "flows are 5-tuple + destination QP (default: 5-tuple)"),
                        *HASHING), stage="flowlet", model="flowlet"),
    "te": AppInfo("centralized TE: CSPF places <source port, destination prefix> entries at the "
                  "leaves above the ECMP defaults",
                  (Option("period_s", float, 1.0, "recompute period", low=0),
                   Option("max_utilization", float, 1.0,
                          "share of a link's rate CSPF may allocate", low=0),
                   Option("min_mbps", float, 0.1,
                          "measured rate below which an unannounced flow is not a demand", low=-1),
                   *HASHING),
                  routing="fabriclab.apps.te:TeRouting", te_engine=True, model="te"),
    "ar": AppInfo("adaptive routing: every packet goes to the member with the least queued bytes "
                  "(seed 002 JSQ), weighted by the capacity behind it; a dead member leaves at once",
                  (Option("quantum_bytes", int, 64,
                          "queue depths compare in steps of this many bytes (0: exactly)", low=-1),
                   _WEIGHTS_ON,
                   Option("carrier", bool, True,
                          "leave a member without carrier in the data path (off: when the controller "
                          "recomputes)"), *HASHING), stage="ar",
                  # per packet to the shortest queue, weighted by capacity: in the fluid limit the
                  # model's capacity-weighted split
                  model="ideal"),
    "pinning": AppInfo("path pinning (seed 000 4.1.2): every packet to a host takes the member its slice (its "
                       "downlink's index on its leaf) picks at each switch; ECMP only when that member is down",
                       HASHING, routing="fabriclab.apps.pinning:PinRouting", model="pinning"),
}


def app_names():
    """Every routing app's name: the built-in ones, then those installed packages add."""
    from fabriclab import plugins

    return plugins.names(APPS, plugins.ROUTING)


def is_custom(name):
    """Whether an app name is a routing class of one's own: `PATH.py:Class` or `package.module:Class`."""
    head = name.partition(":")[0] if isinstance(name, str) else ""
    return ":" in name and ("/" in head or head.endswith(".py") or "." in head) if head else False


def _file_or_module(where, name):
    """A .py file's absolute path, or a dotted module name as given; RoutingError (quoting the
    routing choice `name`) for a file that is not there or a name that is neither."""
    import pathlib

    if where.endswith(".py"):
        path = pathlib.Path(where).expanduser().resolve()
        if not path.is_file():
            raise RoutingError(f"routing {excerpt(name)}: no file {excerpt(str(path))}")
        return str(path)
    if not where or not all(part.isidentifier() for part in where.split(".")):
        raise RoutingError(f"routing {excerpt(name)}: {excerpt(where)} is neither a .py file nor a module name")
    return where


def custom_app(name):
    """The AppInfo of a routing class of one's own (`./my_app.py:MyRouting`, or `package.module:Class`
    installed beside fabriclab), its file resolved to an absolute path. The class is imported and
    checked here, so that a file that does not load is refused before anything is built; it takes
    the hashing options (a run's seed reaches its select groups) and has no flow model."""
    where, _, cls = name.partition(":")
    if not cls.isidentifier():
        raise RoutingError(f"routing {excerpt(name)}: name the class after the file or module (PATH.py:Class)")
    where = _file_or_module(where, name)
    info = AppInfo(f"a routing class of one's own: {where}:{cls}", HASHING, routing=f"{where}:{cls}")
    info.routing_class()
    return info


OSKEN_PREFIX = "osken:"


def is_osken_app(name):
    """Whether a routing choice runs an os-ken app of one's own: `osken:PATH.py[:Class]`."""
    return isinstance(name, str) and name.strip().startswith(OSKEN_PREFIX)


def user_osken_app(name):
    """The AppInfo of `osken:PATH.py[:Class]` (or `osken:package.module[:Class]`): the file is
    loaded and must define one OSKenApp subclass (os-ken runs one app per module), the one named
    if a Class is given. It takes no options and has no flow model."""
    import inspect

    where, _, cls_name = name.strip()[len(OSKEN_PREFIX):].partition(":")
    if cls_name and not cls_name.isidentifier():
        raise RoutingError(f"routing {excerpt(name)}: the os-ken app takes no options (osken:PATH.py[:Class])")
    where = _file_or_module(where, name)
    try:
        from os_ken.base.app_manager import OSKenApp

        module = _import(where)
    except Exception as exc:               # noqa: BLE001 - the user's code may raise anything
        raise RoutingError(f"os-ken app {excerpt(where)} does not load: {type(exc).__name__}: {str(exc)[:120]}") from None
    apps = [c for _n, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, OSKenApp) and c is not OSKenApp and c.__module__ == module.__name__]
    if len(apps) != 1 or (cls_name and apps[0].__name__ != cls_name):
        found = ", ".join(c.__name__ for c in apps) or "none"
        raise RoutingError(f"os-ken app {excerpt(where)}: os-ken runs the one OSKenApp subclass a module "
                           f"defines{f' ({cls_name})' if cls_name else ''}; it defines {excerpt(found)}")
    return AppInfo(f"an os-ken app of one's own: {where}:{apps[0].__name__}", (),
                   osken_app=f"{where}:{apps[0].__name__}")


EXTERNAL_PREFIX = "tcp:"


def is_external(name):
    """Whether a routing choice is a controller the lab does not start: `tcp:HOST:PORT`."""
    return isinstance(name, str) and name.strip().startswith(EXTERNAL_PREFIX)


def is_foreign(name):
    """Whether a routing choice's controller publishes no status to the lab: an os-ken app of
    one's own or a controller the lab does not start."""
    return is_osken_app(name) or is_external(name)


def external_controller(name):
    """The AppInfo of `tcp:HOST:PORT`: an IPv4 address and a port; the lab starts nothing."""
    import ipaddress

    host, _, port = name.strip()[len(EXTERNAL_PREFIX):].rpartition(":")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise RoutingError(f"controller {excerpt(name)}: tcp:HOST:PORT takes an IPv4 address as HOST") from None
    if not port.isdigit() or not 0 < int(port) < 65536 or address.is_unspecified:
        raise RoutingError(f"controller {excerpt(name)}: tcp:HOST:PORT needs a port 1-65535 and one address")
    target = f"{EXTERNAL_PREFIX}{address}:{int(port)}"
    return AppInfo(f"an OpenFlow controller the lab does not start, at {target}", (), external=target)


def app_info(name):
    """The AppInfo of a built-in app, of one an installed package adds (fabriclab/plugins.py), of
    a routing class of one's own (`custom_app`), of an os-ken app of one's own (`user_osken_app`)
    or of a controller the lab does not start (`external_controller`); RoutingError when there is
    none."""
    if is_external(name):
        return external_controller(name)
    if is_osken_app(name):
        return user_osken_app(name)
    if is_custom(name):
        return custom_app(name)
    info = APPS.get(name)
    if info is None and isinstance(name, str):
        from fabriclab import plugins

        try:
            info = plugins.load(plugins.ROUTING, name)
        except Exception as exc:           # noqa: BLE001 - one line, whatever the plugin raised
            raise RoutingError(str(exc)) from None
        if info is not None and not isinstance(info, AppInfo):
            raise RoutingError(f"plugin routing app {excerpt(name)} is a {type(info).__name__}, not an AppInfo")
    if info is None:
        raise RoutingError(f"unknown routing app {excerpt(name)} (available: {', '.join(app_names())})")
    return info


def split_choice(text):
    """(app name, options text) of a routing choice: `te:period_s=2` -> ("te", "period_s=2"),
    `./my_app.py:MyRouting:seed=3` -> ("./my_app.py:MyRouting", "seed=3")."""
    if is_osken_app(text) or is_external(text):
        return text.strip(), ""
    head, _, rest = text.strip().partition(":")
    if is_custom(text.strip()):
        cls, _, rest = rest.partition(":")
        head = f"{head}:{cls}"
    return head, rest
