"""The congestion-control kinds a lab NIC runs, in one registry.

A kind names its parameters class (with `scaled(line_rate_mbps, time_scale, **nic)` from real
NIC units, `to_dict()`, and a constructor from that dict), its reaction point (the sender's rate)
and whether that reaction point takes RTT samples (the agent then sends RTT probes). Everything
that builds congestion-control state goes through `kind(name)`; lists a user sees (CLI choices,
docs) come from `KINDS`.

    dcqcn  DCQCN (traffic/dcqcn.py): CNP-driven cuts, timer and byte-counter recovery
    spx    SPX CC (traffic/spxcc.py): CNP cuts at most once per RTT, RTT probes drive the rest
"""

from __future__ import annotations

from dataclasses import dataclass

from fabriclab.loading import excerpt
from fabriclab.traffic import dcqcn, spxcc


@dataclass(frozen=True)
class CcKind:
    name: str
    params: type                 # DcqcnParams or SpxParams
    reaction_point_class: type   # built from one params object
    uses_rtt: bool               # the reaction point takes RTT samples (on_rtt)
    summary: str

    def scaled(self, line_rate_mbps, time_scale, nic):
        """This kind's parameters for a lab link (ValueError naming a bad NIC parameter)."""
        return self.params.scaled(line_rate_mbps, time_scale, **(nic or {}))

    def from_dict(self, values):
        """Parameters back from `to_dict()` (the agents' config)."""
        return self.params(**values)

    def reaction_point(self, params):
        return self.reaction_point_class(params)


KINDS = {
    "dcqcn": CcKind("dcqcn", dcqcn.DcqcnParams, dcqcn.ReactionPoint, False,
                    "DCQCN: every CNP cuts, timers and bytes recover (ConnectX defaults)"),
    "spx": CcKind("spx", spxcc.SpxParams, spxcc.ReactionPoint, True,
                  "SPX CC: CNPs cut once per RTT, RTT probes raise or gently lower the rate"),
}
DEFAULT = "dcqcn"


def kind(name):
    """The registered kind `name`, or ValueError with a one-line message."""
    found = KINDS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"cc must be one of {', '.join(KINDS)}, got {excerpt(name)}")
    return found


def of_params(params):
    """The kind whose parameters class `params` is an instance of."""
    for found in KINDS.values():
        if type(params) is found.params:
            return found
    raise ValueError(f"no congestion-control kind takes {type(params).__name__}")


def reaction_point(params):
    """A fresh reaction point of the kind `params` belong to."""
    return of_params(params).reaction_point(params)
