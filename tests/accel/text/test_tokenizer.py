"""Loading a model's tokenizer: a checkpoint folder missing on this node is named as such."""

from __future__ import annotations

import pytest

from accel.text.tokenizer import load_tokenizer


def test_a_missing_checkpoint_folder_is_named(tmp_path):
    missing = tmp_path / "models" / "Llama-3.3-70B-Instruct"
    with pytest.raises(FileNotFoundError, match="does not exist on this node") as err:
        load_tokenizer(str(missing))
    assert str(missing) in str(err.value)
