"""The E-ECMP os-ken app: ECMP's groups, with the member chosen per packet by a hash of the
5-tuple and the RoCE BTH destination QP (seed 000, section 4.2.2) in the selection stage."""

from fabriclab.apps.stage_app import StageApp


class EEcmpApp(StageApp):
    stage_mode = "hash"
