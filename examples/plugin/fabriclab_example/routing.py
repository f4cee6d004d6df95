"""`first-path`: every switch sends a destination leaf's traffic through the first of its live
next hops, where ECMP hashes over all of them: a single-path fabric, as a static route or a
pinned scheme leaves it. Written against the routing-as-data API the built-in apps use: a class
whose desired(down_links) gives every switch's entries and groups (here ECMP's, each group cut to
one member), and an AppInfo that names it."""

from fabriclab.apps import AppInfo
from fabriclab.apps.ecmp import EcmpRouting


class FirstPathRouting(EcmpRouting):
    name = "first-path"

    @staticmethod
    def _group(ports, weights):
        return (ports[0],)          # next hops come sorted: the lowest live port wins


APP = AppInfo("single path: each switch's first live next hop towards a leaf carries all of its traffic",
              routing="fabriclab_example.routing:FirstPathRouting")
