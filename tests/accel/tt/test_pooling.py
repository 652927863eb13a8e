"""The TT engines refuse pooling requests by name (they run generative models only)."""

from __future__ import annotations

import pytest

from accel.contract import EmbedRequest, InvalidRequestError
from accel.tt.pooling import refuse_pooling


def test_refused_naming_model():
    with pytest.raises(InvalidRequestError) as err:
        refuse_pooling(EmbedRequest("e", (1, 2)))
    assert err.value.field == "model" and "runner: pooling" in err.value.message
