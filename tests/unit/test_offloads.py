"""Which of a port's features the lab turns off: what `ethtool -K PORT tx off rx off sg off tso off
gso off gro off` turns off, read from a veth's feature list (Linux 6.18)."""

from fabriclab.system import offloads

# name: (enabled, changeable), as a fresh veth reports them
VETH = {"tx-scatter-gather": (True, True), "tx-checksum-ip-generic": (True, True),
        "tx-checksum-sctp": (True, True), "tx-scatter-gather-fraglist": (True, True),
        "tx-generic-segmentation": (True, True), "tx-tcp-segmentation": (True, True),
        "tx-tcp6-segmentation": (True, True), "tx-udp-segmentation": (True, True),
        "tx-gre-segmentation": (True, True), "rx-checksum": (True, True), "rx-gro": (False, True),
        "tx-vlan-hw-insert": (True, True), "rx-vlan-hw-parse": (True, True), "highdma": (True, True),
        "tx-lockless": (True, False), "netns-local": (False, False), "tx-checksum-ipv4": (False, False)}


def test_every_checksum_scatter_gather_and_segmentation_feature_goes_off():
    assert offloads.to_turn_off(VETH) == sorted([
        "tx-scatter-gather", "tx-checksum-ip-generic", "tx-checksum-sctp", "tx-scatter-gather-fraglist",
        "tx-generic-segmentation", "tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-udp-segmentation",
        "tx-gre-segmentation", "rx-checksum"])


def test_what_is_off_already_or_fixed_and_what_does_not_touch_checksums_stays():
    left = set(VETH) - set(offloads.to_turn_off(VETH))
    assert left == {"rx-gro", "tx-vlan-hw-insert", "rx-vlan-hw-parse", "highdma", "tx-lockless", "netns-local",
                    "tx-checksum-ipv4"}
    assert offloads.to_turn_off({"rx-gro": (True, True)}) == ["rx-gro"]
