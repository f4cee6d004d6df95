"""The SwitchML header as a scapy layer, so captures of the lab's aggregation traffic decode
(`rdpcap`, `sniff`) and tests have an independent reading of packet.py's bytes. Importing this
module binds the layer to UDP port SWITCHML_UDP_PORT in both directions."""

from scapy.fields import (ByteField, FieldLenField, FieldListField, FlagsField, IntField,
                          ShortField, SignedIntField, SignedShortField)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from fabriclab.switchml.packet import (MAX_ELEMENTS, NO_EXPONENT, PROTOCOL_VERSION,
                                       SWITCHML_UDP_PORT)


class SwitchML(Packet):
    name = "SwitchML"
    fields_desc = [
        ByteField("proto", PROTOCOL_VERSION),
        FlagsField("flags", 0, 8, ["ver", "result", "retransmit"]),
        ByteField("level", 0),
        ByteField("reserved", 0),
        ShortField("job", 0),
        ShortField("worker", 0),
        ShortField("slot", 0),
        FieldLenField("k", None, fmt="H", count_of="vector"),
        IntField("offset", 0),
        SignedShortField("exponent", NO_EXPONENT),
        SignedShortField("next_exponent", NO_EXPONENT),
        FieldListField("vector", [], SignedIntField("", 0), count_from=lambda pkt: pkt.k,
                       max_count=MAX_ELEMENTS),
    ]


bind_layers(UDP, SwitchML, dport=SWITCHML_UDP_PORT)
bind_layers(UDP, SwitchML, sport=SWITCHML_UDP_PORT)
