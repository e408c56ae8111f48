"""Legacy admission and AlwaysAdmit answer at once (``admit_now``) as ``admit`` does."""

from __future__ import annotations

import pytest

from epp.admission.shedding import SHED_MESSAGE, AlwaysAdmit, LegacyAdmission
from epp.errors import ResourceExhausted
from epp.testing.flowcontrol import FakeDetector
from tests.flowcontrol.helpers import req
from tests.scheduling.builders import endpoint


@pytest.mark.parametrize(
    ("priority", "saturation", "refused"),
    [
        pytest.param(-1, 1.0, True, id="sheddable-saturated-refused"),
        pytest.param(-1, 0.5, False, id="sheddable-unsaturated-admitted"),
        pytest.param(0, 1.0, False, id="critical-saturated-admitted"),
    ],
)
async def test_legacy_admit_now_agrees_with_admit(priority: int, saturation: float, refused: bool) -> None:
    """``admit_now`` refuses exactly what ``admit`` refuses, and returns True otherwise."""
    admission = LegacyAdmission(FakeDetector(saturation))
    eps = [endpoint(0)]
    if refused:
        with pytest.raises(ResourceExhausted, match=SHED_MESSAGE):
            admission.admit_now(req(priority=priority), eps)
        with pytest.raises(ResourceExhausted, match=SHED_MESSAGE):
            await admission.admit(req(priority=priority), eps)
    else:
        assert admission.admit_now(req(priority=priority), eps) is True
        await admission.admit(req(priority=priority), eps)


def test_immediate_admissions_say_they_track_nothing() -> None:
    """Neither makes a request wait, so neither needs a call when a request is placed or completes."""
    assert LegacyAdmission.TRACKS is False
    assert AlwaysAdmit.TRACKS is False
    assert AlwaysAdmit().admit_now(req(), []) is True
