"""TpModelWorker: one rank's model runner plus sampling (SGLang's ``tp_worker.py``).

The scheduler hands it a ``ModelWorkerBatch`` and the batch's ``SamplingBatchInfo``; it returns
the logits of the requested rows and the sampled next tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixlm.kernels.gpu_sampling import sample
from radixlm.kernels.sampling import SamplingBatchInfo, apply_logits_processors
from radixlm.srt.forward_batch import ModelWorkerBatch
from radixlm.srt.layers.parallel_state import TpGroup
from radixlm.srt.model_config import ModelConfig
from radixlm.srt.model_runner import ModelRunner
from radixlm.srt.server_args import ServerArgs


@dataclass
class WorkerOutput:
    """logits: (R, vocab) raw model logits of the rows in ``logits_row_offsets``: float32, or the
    model's dtype after a greedy-only step with nothing editing the logits (on CPU; consumers upcast).
    next_token_ids: (bs,) int64 tokens sampled from each request's last row (None if not sampled)."""

    logits: torch.Tensor
    logits_row_offsets: list[int]
    next_token_ids: Optional[torch.Tensor]


class TpModelWorker:
    def __init__(self, model_config: ModelConfig, server_args: ServerArgs, tp: TpGroup = TpGroup()):
        torch.manual_seed(server_args.random_seed)
        self.model_runner = ModelRunner(model_config, server_args, tp)
        self.model_config = model_config

    @property
    def max_total_num_tokens(self) -> int:
        return self.model_runner.max_total_num_tokens

    def forward_batch_generation(self, batch: ModelWorkerBatch, sampling_info: Optional[SamplingBatchInfo],
                                 vocab_mask: Optional[torch.Tensor] = None) -> WorkerOutput:
        """Forward, then sample one token from the last row of each request when ``sampling_info``
        is given (its rows align with the batch's requests)."""
        # Greedy rows with nothing editing the logits (on CPU): the argmax reads the model's own
        # (bf16) logits, the same index as on their exact fp32 widening, without the (R, vocab) fp32
        # copy (~2 ms of a 128-request decode step of SmolLM2 on a 2-core Xeon).
        untouched = sampling_info is not None and not sampling_info.edits_logits and vocab_mask is None
        raw = untouched and sampling_info.is_all_greedy and self.model_runner.device.type == "cpu"
        logits = self.model_runner.forward(batch, float_logits=not raw)
        _, row_offsets = batch.logits_layout()
        next_ids = None
        if sampling_info is not None:
            if untouched and len(row_offsets) - 1 == logits.shape[0]:
                # one row per request, all last rows, and nothing edits them in place: no (bs, V) copy
                last = logits
            else:
                last_rows = torch.tensor([o - 1 for o in row_offsets[1:]], dtype=torch.int64, device=logits.device)
                last = logits.index_select(0, last_rows)
            last = apply_logits_processors(last, sampling_info, vocab_mask)
            next_ids = sample(last, sampling_info)
        return WorkerOutput(logits, row_offsets, next_ids)
