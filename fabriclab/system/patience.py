"""How long the lab waits for its own parts (controller, agents, barriers), stretched where the
machine is slow.

FABRICLAB_PATIENCE, a factor (default 1), multiplies those bounds. The full-kernel guest sets it,
since under software emulation everything runs several times slower: a controller that listens in
2 s here took more than 20 s there. Waits that are part of a measurement are not stretched.
"""

import os

ENV = "FABRICLAB_PATIENCE"


def factor():
    try:
        value = float(os.environ.get(ENV, "1"))
    except ValueError:
        return 1.0
    return value if value >= 1 else 1.0


def scaled(seconds):
    return seconds * factor()
