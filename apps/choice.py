"""A routing choice as one value: parsed where it enters the lab (the CLI, a scenario, the Python
API's Lab, RunPlan and experiment Options) and passed down as it is, so nothing below parses the
text again, and a routing class of one's own is imported once to check it, not at every layer.

`Routing.parse("flowlet:gap_us=500")` holds the app's name, every option filled in (`settings`),
which options the text set itself (`given`: a run's seed fills `seed` only where the text did
not), and the app's AppInfo. Two choices are equal when their canonical labels are ("ecmp:seed=0"
is "ecmp"; a string is parsed to compare); `str()` is that label, which is what results record.
"""

from __future__ import annotations

from types import MappingProxyType

from fabriclab.apps import OSKEN_PREFIX, RoutingError, app_info, is_custom, split_choice
from fabriclab.loading import excerpt


class Routing:
    """An app and its options, checked. Build it with `Routing.parse`."""

    __slots__ = ("name", "settings", "given", "info", "label")

    def __init__(self, name, settings, given, info):
        self.name = name                              # a custom app's is its absolute PATH.py:Class
        self.settings = MappingProxyType(dict(settings))
        self.given = frozenset(given)
        self.info = info
        defaults = info.defaults()
        changed = [f"{k}={v}" for k, v in self.settings.items() if v != defaults[k]]
        self.label = name + (":" + ",".join(changed) if changed else "")

    @classmethod
    def parse(cls, choice):
        """The Routing of `name[:opt=value,...]` (a Routing is returned as it is); RoutingError in
        one line for an unknown app, option or value."""
        if isinstance(choice, Routing):
            return choice
        if not isinstance(choice, str) or not choice.strip():
            raise RoutingError(f"routing must be an app name, got {excerpt(choice)}")
        name, rest = split_choice(choice)
        info = app_info(name)
        if info.osken_app:
            name = OSKEN_PREFIX + info.osken_app         # the file's absolute path and the class
        elif info.external:
            name = info.external
        elif is_custom(name):
            name = info.routing                           # a class of one's own: its file's absolute path
        settings = info.defaults()
        known = {o.name: o for o in info.options}
        given = set()
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if key not in known:
                have = ", ".join(sorted(known)) or "none"
                raise RoutingError(f"routing {name}: unknown option {excerpt(key)} (options: {have})")
            if not eq:
                raise RoutingError(f"routing {name}: option {key} needs a value ({key}=...)")
            settings[key] = known[key].parse(name, value)
            given.add(key)
        return cls(name, settings, given, info)

    def with_seed(self, seed):
        """This choice with its hash seed set to `seed`, unless it set one itself (a run's seed
        reaches every switch's hash basis: apps/hashing.py). An app without a `seed` option (one
        an installed package adds) is returned as it is."""
        if "seed" not in self.settings or "seed" in self.given:
            return self
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise RoutingError(f"a run's hash seed must be a whole number >= 0, got {excerpt(seed)}")
        return Routing(self.name, {**self.settings, "seed": seed}, self.given | {"seed"}, self.info)

    @property
    def external(self):
        """A controller the lab does not start (`tcp:HOST:PORT`)."""
        return self.info.external is not None

    @property
    def foreign(self):
        """Its controller publishes no status to the lab: an os-ken app of one's own, or external."""
        return self.external or self.info.osken_app is not None

    def __str__(self):
        return self.label

    def __repr__(self):
        return f"Routing({self.label!r})"

    def __eq__(self, other):
        if isinstance(other, str):           # `lab.routing == "te"`: a user's comparison, parsed
            try:
                other = Routing.parse(other)
            except RoutingError:
                return False
        return isinstance(other, Routing) and other.label == self.label

    def __hash__(self):
        return hash(self.label)
