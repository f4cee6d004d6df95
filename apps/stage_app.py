"""FabricApp with a per-packet selection stage (select_stage.bpf.c) under its ECMP groups.

The OpenFlow part is ECMP's (select groups per destination leaf, watched buckets); the stage
re-chooses each packet's member at the switch's egress. Subclasses set `stage_mode` and may
override `stage_settings` to pass their options.
"""

from __future__ import annotations

import time

from fabriclab.apps.base_app import FabricApp
from fabriclab.apps.ecmp import EcmpRouting
from fabriclab.apps.select_stage import SelectStage, fabric_port_names, group_members, pins_for


class StageApp(FabricApp):
    routing_class = EcmpRouting
    stage_mode = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stage = SelectStage(pins_for(self.run_id or "adhoc"), self.stage_mode,
                                 **self.stage_settings()).load()
        self.stage_updated = None

    def stage_settings(self):
        return {"seed": self.options.get("seed", 0)}

    def before_program(self, desired):
        # Attach to a switch's ports once it has connected (its interfaces exist by then), and
        # write the members first: a member whose link died must leave before anything else.
        for switch in self.links.connected:
            self.stage.attach(fabric_port_names(self.fabric, switch))
        self.stage.set_members(group_members(self.fabric, desired))
        self.stage_updated = time.time()

    def extra_status(self):
        stage = getattr(self, "stage", None)
        if stage is None:
            return {}
        return {"stage": {"mode": self.stage_mode, "pins": str(stage.pins), "groups": len(stage.written),
                          "attached_ports": len(stage.attached), "updated": self.stage_updated}}
