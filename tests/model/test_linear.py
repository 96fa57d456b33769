import pytest
import torch
import torch.nn.functional as F

from radixserve.model.linear import FEW_ROWS, Linear, linear


@pytest.mark.parametrize("rows", [1, 7, FEW_ROWS, FEW_ROWS + 1, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch_at_any_row_count(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(160, 96, generator=g)
    b = torch.randn(160, generator=g) if bias else None
    out = linear(x, w, b)
    assert out.is_contiguous() and out.shape == (rows, 160)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_other_dtypes_and_shapes_take_torchs_path():
    w = torch.randn(32, 16).bfloat16()
    x = torch.randn(4, 16).bfloat16()
    assert torch.equal(linear(x, w), F.linear(x, w))
    x3 = torch.randn(2, 3, 16)
    assert torch.equal(linear(x3, w.float()), F.linear(x3, w.float()))


def test_linear_module_keeps_nn_linear_parameter_names():
    ref = torch.nn.Linear(8, 4)
    layer = Linear(8, 4)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), ref(x))
