"""A switch port's offloads turned off in this process, two ioctls per port through pyroute2.

The userspace datapath forwards what AF_PACKET hands it, so a checksum a veth left for the NIC to
finish would reach the far end unfinished: every switch port gets what `ethtool -K PORT tx off
rx off sg off tso off gso off gro off` does. What goes off: every transmit checksum,
scatter-gather and segmentation feature the port has on (the tunnel segmentation ones with them),
receive checksumming and GRO.

A process per port cost 3.3 s of a 1,280-port bring-up (32x16x8). pyroute2's Ethtool.get_features
and set_features cost as much again: each asks for the feature names (decoded a character at a
time in Python) and the old-style offload flags (about ten ioctls), twice a port, 3.2 ms in all.
The names are the kernel's one table (ETH_SS_FEATURES is not per driver), so they are read once;
then a port costs one ETHTOOL_GFEATURES and one ETHTOOL_SFEATURES, with pyroute2's structures.
"""

from __future__ import annotations

import ctypes

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
    from pyroute2.ethtool import ioctl as eth

    handle = eth.IoctlEthtool()
    names, name = None, None
    try:
        for name in interfaces:
            handle.change_ifname(name)
            if names is None:
                names = handle.get_stringset(set_id=eth.ETH_SS_FEATURES)
            blocks = eth.feature_bits_to_blocks(len(names))
            got = eth.EthtoolGfeatures(cmd=eth.ETHTOOL_GFEATURES, size=blocks)
            handle.ifreq.gfeatures = ctypes.pointer(got)
            handle.ioctl()
            state = {n: (_bit(got.features, i, "active"), _bit(got.features, i, "available"))
                     for i, n in enumerate(names)}
            off = to_turn_off(state)
            if not off:
                continue
            change = eth.EthtoolSfeatures(cmd=eth.ETHTOOL_SFEATURES, size=blocks)
            for i, n in enumerate(names):
                if n in off:          # changed, and active left 0: requested off
                    change.features[i // 32].changed |= 1 << (i % 32)
            handle.ifreq.sfeatures = ctypes.pointer(change)
            handle.ioctl()
    except Exception as exc:            # pyroute2 raises its own types as well as OSError
        raise LabError(f"switch port offloads: {name}: {str(exc)[:120]}") from None
    finally:
        handle.close()


def _bit(blocks, i, field):
    return bool(getattr(blocks[i // 32], field) >> (i % 32) & 1)
