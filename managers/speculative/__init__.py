"""Speculative decoding: n-gram drafts (``ngram``), the acceptance rule (``verify``) and the
scheduler's seam (``decoder.NgramSpeculator``). See docs/architecture.md, "Speculative decoding"."""

from radixlm.managers.speculative.decoder import NgramSpeculator

__all__ = ["NgramSpeculator"]
