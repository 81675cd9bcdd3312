"""Weights kept quantized: formats (``formats.py``), the C++ kernels (``cpu/quant_gemm.cpp``) and
the GEMM backend over them (``gemm.QuantGemm``). Which layers get which format is decided at model
load (``radixlm.srt.quantization``)."""
