"""A switch port's offloads turned off in this process, one ioctl per port through pyroute2.

The userspace datapath forwards what AF_PACKET hands it, so a checksum a veth left for the NIC to
finish would reach the far end unfinished: every switch port gets what `ethtool -K PORT tx off
rx off sg off tso off gso off gro off` does. A process per port cost 3.3 s of a 1,280-port
bring-up; this costs about 0.5 ms a port. What goes off: every transmit checksum, scatter-gather
and segmentation feature the port has on (the tunnel segmentation ones with them), receive
checksumming and GRO.
"""

from __future__ import annotations

from fabriclab.errors import LabError

ETHTOOL_OFF = "tx off rx off sg off tso off gso off gro off"
"""The same as `ethtool -K PORT` words, where a shell does it (a host's namespace, another machine)."""
OFF_PREFIXES = ("tx-checksum", "tx-scatter-gather")
OFF_NAMES = ("rx-checksum", "rx-gro")


def to_turn_off(features):
    """The names, of {feature: (enabled, changeable)}, that are on and must go off."""
    return sorted(name for name, (enabled, changeable) in features.items()
                  if enabled and changeable
                  and (name.startswith(OFF_PREFIXES) or name.endswith("segmentation") or name in OFF_NAMES))


def turn_off(interfaces):
    """Turn the offloads off on each of `interfaces` (in this process's network namespace)."""
    from pyroute2.ethtool import Ethtool

    ethtool = Ethtool()
    name = None
    try:
        for name in interfaces:
            features = ethtool.get_features(name)
            names = to_turn_off({n: (f.enable, f.available) for n, f in features.features.items()})
            for feature in names:
                features.features[feature].enable = False
            if names:
                ethtool.set_features(name, features)
    except Exception as exc:            # pyroute2 raises its own types as well as OSError
        raise LabError(f"switch port offloads: {name}: {str(exc)[:120]}") from None
    finally:
        ethtool.close()
