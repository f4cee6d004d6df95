"""The flowlet os-ken app: ECMP's groups, with flowlet switching in the selection stage (seed 000,
section 4.5): a flow idle longer than `gap_us` is re-assigned to the member that sent the fewest
bytes in the last load window; a new flow starts on that member instead of on a hash."""

from fabriclab.apps.stage_app import StageApp


class FlowletApp(StageApp):
    stage_mode = "flowlet"

    def stage_settings(self):
        return {"seed": self.options.get("seed", 0), "hash_qp": self.options.get("qp", False),
                "gap_ns": self.options.get("gap_us", 10000.0) * 1e3,
                "window_ns": self.options.get("load_window_us", 2000.0) * 1e3}
