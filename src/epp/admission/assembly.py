"""Admission assembles itself: the saturation detector and, with the ``flowControl`` gate, the
flow-control plan → an ``AdmissionController`` over the datastore's pool.

Why here: the choice between the legacy saturation check and flow-control queueing is
admission's; the config layer only says which plugins and settings it resolved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epp.admission.api import AdmissionController
from epp.admission.shedding import LegacyAdmission
from epp.datastore.store import Datastore
from epp.flowcontrol.api import SaturationDetector

if TYPE_CHECKING:
    from epp.flowcontrol.assembly import FlowControlPlan


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    """The detector, and the flow-control plan when the ``flowControl`` gate is on."""

    detector: SaturationDetector
    flow_control: FlowControlPlan | None = None

    def controller(self, datastore: Datastore) -> AdmissionController:
        """Nothing starts here: a flow-control admission runs its dispatcher once entered."""
        if self.flow_control is None:
            return LegacyAdmission(self.detector)
        from epp.admission.flow_control import FlowControlAdmission  # only with the gate on

        return FlowControlAdmission.from_plan(self.flow_control, datastore)
