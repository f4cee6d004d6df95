"""`fabriclab reproduce`: every claim of the seeds the lab can test, each under the paper's
conditions as far as the lab can set them, checked in one run and written as one catalogue.

    fabriclab reproduce [--quick] [--only 000|000-eecmp-gain,...] [--out DIR] [--markdown FILE]

The claims live one module per seed (seed000 ... seed003); `claim` holds what a claim and a
finding are and how agreement is stated; `catalogue` runs the experiments the chosen claims read
(each once), measures every claim and writes the catalogue.
"""

from __future__ import annotations

from fabriclab.errors import LabError
from fabriclab.workflows.reproduce import seed000, seed001, seed002, seed003

CLAIMS = (*seed000.CLAIMS, *seed001.CLAIMS, *seed002.CLAIMS, *seed003.CLAIMS)
SEEDS = tuple(dict.fromkeys(c.seed for c in CLAIMS))


def select(only=None):
    """The claims `only` names: None (all), or a comma-separated list of seeds ("000") and claim
    ids ("000-eecmp-gain"); an unknown name is an error that lists the known ones."""
    if not only:
        return CLAIMS
    names = [n.strip() for n in str(only).split(",") if n.strip()]
    if not names or len(names) > len(CLAIMS) + len(SEEDS):
        raise LabError(f"--only takes seeds ({', '.join(SEEDS)}) or claim ids, comma-separated")
    known = {c.id for c in CLAIMS}
    for name in names:
        if name not in known and name not in SEEDS:
            raise LabError(f"--only: unknown seed or claim {name[:40]!r}: seeds {', '.join(SEEDS)}; "
                           f"claims {', '.join(c.id for c in CLAIMS)}")
    return tuple(c for c in CLAIMS if c.id in names or c.seed in names)


def experiments_for(claims):
    """The packaged experiments the claims read, each once, in the experiments' listed order."""
    from fabriclab.workflows.experiments import EXPERIMENTS

    wanted = {e for c in claims for e in c.experiments}
    return [name for name in EXPERIMENTS if name in wanted]
