"""kernels/gpu_sampling.py on CPU: always the torch path, token for token."""

from __future__ import annotations

import torch

from radixlm.kernels import gpu_sampling, sampling
from radixlm.kernels.sampling import SamplingBatchInfo
from radixlm.srt.sampling_params import SamplingParams


def test_cpu_uses_torch_sampling_unchanged():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
              SamplingParams(temperature=1.0, sampling_seed=11), SamplingParams(temperature=1.2, min_p=0.05)]
    info = SamplingBatchInfo.from_requests(params, [[] for _ in params], 64, [frozenset()] * 4)
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    assert not gpu_sampling.use_flashinfer(logits, info)
    torch.manual_seed(5)
    ours = gpu_sampling.sample(logits, info)
    torch.manual_seed(5)
    assert torch.equal(ours, sampling.sample(logits, info))
