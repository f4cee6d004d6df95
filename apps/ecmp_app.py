"""The ECMP os-ken app: FabricApp with ECMP routing (one select group per destination leaf)."""

from fabriclab.apps.base_app import FabricApp
from fabriclab.apps.ecmp import EcmpRouting


class EcmpApp(FabricApp):
    routing_class = EcmpRouting
