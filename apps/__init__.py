"""os-ken controller apps. APPS maps the name a user gives (`--routing NAME`) to its module.

To add an app: write a routing class (desired state as data, see ecmp.py), a module with a
FabricApp subclass that sets `routing_class`, and register it here.
"""

APPS = {
    "ecmp": "fabriclab.apps.ecmp_app",
}
