"""What an aggregator must know about a job to give it a pool, checked before anything runs."""

from __future__ import annotations

import dataclasses

from fabriclab.errors import LabError
from fabriclab.switchml.packet import MAX_ELEMENTS, U16


class JobConfigError(LabError):
    """A SwitchML job or worker parameter is out of range; the message names it and the job."""


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One job as one aggregator sees it.

    `workers` counts the senders whose updates this aggregator adds up: the job's workers for a
    single-rack aggregator, the rack's own workers for a leaf one, the leaf aggregators for the
    spine. `slots` (s) and `elements` (k) are the job's pool: s slots of k integers, twice over.
    """

    job_id: int
    workers: int
    slots: int
    elements: int

    def __post_init__(self):
        owner = f"SwitchML job {self.job_id}"
        check_field(owner, "job_id", self.job_id, 0, U16)
        check_field(owner, "workers", self.workers, 1, U16 + 1)
        check_field(owner, "slots", self.slots, 1, U16 + 1)
        check_field(owner, "elements", self.elements, 1, MAX_ELEMENTS)


def check_field(owner: str, name: str, value, low: int, high: int) -> None:
    """Raise JobConfigError unless `value` is an integer in low..high (most bounds are the
    header's field widths); `owner` says whose field it is ("SwitchML job 3")."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise JobConfigError(f"{owner}: {name}={value!r} must be an integer in {low}..{high}")
