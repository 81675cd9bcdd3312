"""radixlm.kernels"""
