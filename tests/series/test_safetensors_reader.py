"""topometrics.series.safetensors_reader: streamed tensors equal torch's; a bad file is named."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from topometrics.models.checkpoints import CheckpointError
from topometrics.series.safetensors_reader import SafetensorsFile


def test_safetensors_file_errors_name_the_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=f"^{path}: not a readable safetensors file"):
        SafetensorsFile(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_streamed_reads_equal_torch_for_every_float_dtype(tmp_path, dtype):
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 700, generator=gen) * 3).to(dtype)  # > 1 MiB in float32: several chunks
    w[17, 5] = -100.0
    save_file({"w": w, "b": torch.ones(3, dtype=dtype)}, str(tmp_path / "t.safetensors"))
    f = SafetensorsFile(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(f.read("w"), w.float().numpy())
    assert f.read("w").dtype == np.float32
    assert f.absmax("w") == 100.0
    w[200, 3] = float("nan")
    save_file({"w": w}, str(tmp_path / "nan.safetensors"))
    assert np.isnan(SafetensorsFile(tmp_path / "nan.safetensors").absmax("w"))
